"""Who may see a job and its files: one rule, used by every route and job that checks it (no torch).

A job's owner is the API key name that submitted it, in the job's meta; its files keep an owner record
(:func:`core.artifacts.owner_record`) for as long as they exist, so the rule holds after the job's own record
expired. Anything that is not the caller's answers exactly as a missing object (404): a job's existence is private.
Registered names (models, datasets) are shared and follow :func:`core.registry.check_owner` instead; what another
tenant sees of a shared model is :func:`sees_model_details` and :func:`summary_meta`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core import registry
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


# The meta of a registered model that another tenant sees: its measured quality, nothing of how it was made (the
# job that produced it, its dataset, its training configuration and checkpoints, where it was imported from).
METRIC_META = frozenset({"metrics", "accuracy", "valid", "best_val_accuracy", "test_accuracy",
                         "test_mrr", "test_hits@1", "test_hits@3", "test_hits@10"})


def sees_model_details(entry: Mapping[str, Any], caller: str | None) -> bool:
    """The whole record of a registered model is for its owner, and for everyone when it is the service's own
    (a demo model, owned by ``system``); another tenant's model shows only its summary."""
    owner = entry.get("owner") or registry.SYSTEM
    return owner == registry.SYSTEM or (caller is not None and owner == caller)


def summary_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """The metrics of a model's meta (:data:`METRIC_META`), the rest left out."""
    return {k: v for k, v in (meta or {}).items() if k in METRIC_META}
