"""When a shared, content-addressed store entry was last used (no torch).

Two kinds of entries are shared by content rather than owned by a job: gradient features (``features/<key>/``,
``POST /featurize`` and the queries that read them) and what evaluations train (``cache/evaluation/models/<digest>/``
and ``cache/evaluation/lds/<key>/``). A job that reads or writes one records the time in
``lastuse/<entry>.json``; ``explainq gc`` deletes an entry not used for ``EXPLAINQ_CACHE_TTL_S`` (30 days by
default), with its record. An entry without a record (written before records existed) gets one at the first gc
pass, which starts its clock. Recording is best effort: a job never fails because the record could not be written.

Each use is also a **claim** of the tenant whose job used it: ``claims/<owner>/<job id>/<entry>.json``. The
tenant's stored bytes (``GET /usage``, the store budget) count every shared entry one of their jobs still on
record used or wrote, each in full (one copy serves every tenant that asks for the same content; each is charged
as if it were theirs alone, so no tenant's figure moves with another's work). Deleting the job releases its
claims (``DELETE /jobs/<id>``); a job whose record has expired no longer counts, and retention removes its
claims.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from core.filestore import StoreError, clean_key

log = logging.getLogger("explainq.lastuse")

PREFIX = "lastuse"
CLAIMS = "claims"
EVALUATION_ROOT = "cache/evaluation"
# the families of entries gc ages out: (the store folder listing them, the entry's key under it)
FAMILIES = ("features", f"{EVALUATION_ROOT}/models", f"{EVALUATION_ROOT}/lds")


def marker_key(entry: str) -> str:
    return clean_key(PREFIX, f"{clean_key(entry)}.json")


def touch(store: Any, entries: Iterable[str], now: float | None = None) -> None:
    """Record that ``entries`` (store keys of shared entries) were used now."""
    body = json.dumps({"at": round(time.time() if now is None else now, 3)}).encode()
    for entry in dict.fromkeys(entries):
        try:
            store.put_bytes(body, marker_key(entry))
        except Exception:  # a record is advice for retention; never fail the job for it
            log.warning("could not record the use of %s", entry, exc_info=True)


def last_used(store: Any, entry: str) -> float | None:
    try:
        return float(json.loads(store.read_bytes(marker_key(entry)))["at"])
    except (StoreError, ValueError, KeyError, TypeError):
        return None


def forget(store: Any, entry: str) -> None:
    store.delete(marker_key(entry))


def claim(store: Any, owner: str, job_id: str, entries: Iterable[str], now: float | None = None) -> None:
    """Record that ``owner``'s job ``job_id`` used ``entries`` (best effort, as :func:`touch`)."""
    body = json.dumps({"at": round(time.time() if now is None else now, 3)}).encode()
    for entry in dict.fromkeys(entries):
        try:
            store.put_bytes(body, clean_key(CLAIMS, owner, job_id, f"{clean_key(entry)}.json"))
        except Exception:  # as for touch: advice for the budget, never a job's failure
            log.warning("could not record %s's use of %s", owner, entry, exc_info=True)


def claims(store: Any, owner: str) -> dict[str, set[str]]:
    """``{entry: {job ids}}``: the shared entries ``owner``'s jobs claimed."""
    out: dict[str, set[str]] = {}
    for f in store.list_files(clean_key(CLAIMS, owner)):
        job_id, _, rest = f["name"].partition("/")
        if rest.endswith(".json"):
            out.setdefault(rest[: -len(".json")], set()).add(job_id)
    return out


def release(store: Any, owner: str, job_ids: Iterable[str]) -> None:
    """Drop the claims of ``owner``'s jobs ``job_ids`` (the job was deleted or has expired)."""
    for job_id in job_ids:
        store.delete(clean_key(CLAIMS, owner, job_id))


def owners_with_claims(store: Any) -> list[str]:
    return store.list_dirs(CLAIMS)


def claimed_jobs(store: Any, owner: str) -> list[str]:
    return store.list_dirs(clean_key(CLAIMS, owner))
