"""What produced a result: one block, the same for every kind, attached by the runner (``workers/provenance.py``)
to every result model that names it (``provenance``). Optional on read: results stored before it existed validate
without it."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from core.contract.results.base import ResultModel


class ModelProvenance(ResultModel):
    """A registered model a job read (or registered): its registry version and a digest of its files."""

    field: str | None = Field(None, description="the request field naming it (None: a model the job registered)")
    name: str
    kind: str | None = None
    owner: str | None = None
    version: str | None = Field(None, description="the registry version (its store version key)")
    digest: str | None = Field(None, description="SHA-256 over the version's files (names and contents): weights, "
                               "configuration and checkpoints; computed once when the version is registered")
    registered_at: str | None = None


class DatasetProvenance(ResultModel):
    """The dataset a request names: a registered one's version and digest (when the registry recorded one), or a
    directory under the data roots (or data the service ships) by the name the request gave."""

    field: str
    name: str
    source: str = Field(description="'registered', 'directory' (under the data roots) or 'packaged' (shipped with "
                        "the service)")
    kind: str | None = None
    owner: str | None = None
    version: str | None = None
    digest: str | None = Field(None, description="SHA-256 over the registered version's files, when recorded")
    registered_at: str | None = None


class Software(ResultModel):
    explainq: str | None = None
    commit: str | None = Field(None, description="the git commit explainq runs from (None when not known)")
    python: str | None = None
    torch: str | None = None
    cuda: str | None = Field(None, description="the CUDA version torch was built with (None: a CPU build)")


class Provenance(ResultModel):
    """What produced a result: the models and datasets (with digests), the request as it ran (defaults filled
    in), its seeds, precision and device, the software, the worker and the times."""

    job_id: str | None = None
    kind: str | None = None
    models: list[ModelProvenance] = Field(default_factory=list)
    registered: list[ModelProvenance] = Field(default_factory=list, description="models the job registered")
    datasets: list[DatasetProvenance] = Field(default_factory=list)
    request: dict[str, Any] | None = Field(None, description="the request as run, defaults filled in (None when "
                                           "larger than 64 KiB: GET /jobs/{id}/request serves it)")
    request_sha256: str | None = None
    seeds: dict[str, Any] = Field(default_factory=dict, description="every seed of the request, by dotted field")
    precision: str | None = None
    device: str | None = None
    software: Software = Field(default_factory=Software)
    worker: str | None = Field(None, description="the worker's host name")
    started_at: str | None = None
    finished_at: str | None = None


PROVENANCE_DESCRIPTION = "what produced this result (absent from results stored by earlier versions)"
