"""Who may see a job and its files: one rule, used by every route and job that checks it (no torch).

A job's owner is the API key name that submitted it, in the job's meta; its files keep an owner record
(:func:`core.artifacts.owner_record`) for as long as they exist, so the rule holds after the job's own record
expired. Anything that is not the caller's answers exactly as a missing object (404): a job's existence is private.
Registered names (models, datasets) are shared and follow :func:`core.registry.check_owner` instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.artifacts import owner_record
from core.settings import Settings


def owns(record: Mapping[str, Any] | None, caller: str | None) -> bool:
    """``record`` (a job's meta or its files' owner record) exists and names ``caller`` as its owner."""
    return bool(record) and caller is not None and record.get("owner") == caller


def owns_files(settings: Settings, job_id: str, caller: str | None,
               job_meta: Mapping[str, Any] | None = None) -> bool:
    """The files of ``job_id`` are the caller's: the job's meta says so while the job record exists (pass it as
    ``job_meta``), else the owner record kept with the files does."""
    if job_meta is not None:
        return owns(job_meta, caller)
    return owns(owner_record(settings, job_id), caller)
