"""What every result model shares: the strict base, open records, artifacts, listed lists, shards."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

Triple = list[str]  # [head, relation, tail] by name


class ResultModel(BaseModel):
    """The base of every result model: a field it does not name is an error (the model documents the result)."""

    model_config = ConfigDict(extra="forbid")


class OpenRecord(BaseModel):
    """A record a pipeline writes as it is: its typed fields are what clients read; others are kept."""

    model_config = ConfigDict(extra="allow")


class Artifact(OpenRecord):
    """One of the job's files (``GET /jobs/{id}/artifacts/<name>``)."""

    name: str
    size: int
    media_type: str


class Listed(ResultModel):
    """A list of which the result holds the first ``inline`` of ``total`` entries; all of them are in the JSONL
    artifact ``artifact`` (one entry per line, in the list's order)."""

    total: int
    inline: int
    artifact: str | None = None


class Shards(ResultModel):
    """How a fanned-out run was split: ``total`` shards, the ``failed`` ones (indices) left out."""

    total: int
    failed: list[int] = Field(default_factory=list)


# a record whose keys are not Python names ("hits@1", "model_config"): its fields carry the key as their alias,
# are filled by either, and are written by the alias
BY_ALIAS = dict(validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)


class RankMetrics(ResultModel):
    """Filtered link-prediction metrics of a knowledge-graph model on one split (``models.kg.train.rank_metrics``):
    both sides' ranks, ties counting half."""

    model_config = ConfigDict(extra="forbid", **BY_ALIAS)

    mrr: float
    mr: float
    hits_at_1: float = Field(alias="hits@1")
    hits_at_3: float = Field(alias="hits@3")
    hits_at_10: float = Field(alias="hits@10")
    n_queries: int
