"""Where a succeeded job's result lives (no torch).

A result of at most ``EXPLAINQ_RESULT_INLINE_BYTES`` (as JSON) stays in Redis beside the job's record, as RQ keeps
any return value. A larger one is written to the store at ``results/<job id>.json`` before the job ends, and Redis
keeps a pointer to it: ``{"$stored_result": {"bytes": n, "sha256": digest}}``. Reading the job's result follows the
pointer and checks the size and digest, so Redis holds a few hundred bytes for a dataset-scale TracIn, and the
result file shares its job's lifetime: ``explainq gc`` removes it with the job's artifacts once the record has
expired (never while the job is kept), and deleting the job deletes it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from core.filestore import StoreError, clean_key, get_store
from core.jobview import loads_finite
from core.settings import Settings

RESULTS_PREFIX = "results"
POINTER = "$stored_result"


class StoredResultError(Exception):
    """A pointer whose file is missing from the store (``missing``) or differs from what was written
    (``corrupt``)."""

    def __init__(self, code: str, job_id: str, message: str):
        super().__init__(message)
        self.code = code
        self.job_id = job_id
        self.message = message


def result_key(job_id: str) -> str:
    return clean_key(RESULTS_PREFIX, f"{job_id}.json")


def encode(result: Any) -> bytes:
    """The result as stored: compact JSON (a non-finite number, which the runner has already replaced, would read
    back as null, as RQ's own serializer reads it here)."""
    return json.dumps(result, separators=(",", ":")).encode("utf-8")


def is_pointer(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(POINTER), dict)


def keep(settings: Settings, job_id: str, result: Any) -> Any:
    """What Redis should hold for ``result``: the result itself when small enough, else (after writing it to the
    store) its pointer. A store failure propagates: the job must not end with its result lost."""
    data = encode(result)
    if len(data) <= settings.result_inline_bytes:
        return result
    get_store(settings).put_bytes(data, result_key(job_id))
    return {POINTER: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}


def resolve(settings: Settings, job_id: str, value: Any) -> Any:
    """The result ``value`` stands for: itself, or the stored file its pointer names, checked against the
    pointer's size and digest."""
    if not is_pointer(value):
        return value
    pointer = value[POINTER]
    try:
        data = get_store(settings).read_bytes(result_key(job_id))
    except StoreError:
        raise StoredResultError("result_missing", job_id, f"the result of job {job_id} is no longer in the "
                                "store (removed outside explainq); its record remains") from None
    if len(data) != pointer.get("bytes") or hashlib.sha256(data).hexdigest() != pointer.get("sha256"):
        raise StoredResultError("result_corrupt", job_id, f"the stored result of job {job_id} does not match "
                                "the size and SHA-256 recorded when it was written")
    return loads_finite(data.decode("utf-8"))


def delete(settings: Settings, job_id: str) -> None:
    get_store(settings).delete(result_key(job_id))


def stored_ids(settings: Settings) -> list[str]:
    """Job ids that have a result file in the store."""
    names = [f["name"] for f in get_store(settings).list_files(RESULTS_PREFIX)]
    return [n[:-len(".json")] for n in names if n.endswith(".json") and "/" not in n]
