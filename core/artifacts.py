"""Job artifacts in the store: ``artifacts/<job id>/<relative name>`` (no torch).

A job writes its files into a local scratch directory; when it ends (and, for training, at each checkpoint) they are
copied into the store, so any API process on any host can list and stream them, and a training job restarted on
another host resumes from them. ``explainq:artifacts:owners`` records each job's owner for as long as its files
exist, so ownership is checked even after the job's record expired from Redis; ``explainq gc`` deletes the files of
jobs that no longer exist.
"""

from __future__ import annotations

import json
from typing import Any

from core import keys, registry
from core.filestore import clean_key
from core.settings import Settings


def artifacts_key(job_id: str, *parts: str) -> str:
    return clean_key("artifacts", job_id, *parts)


def record_owner(settings: Settings, job_id: str, owner: str, kind: str | None) -> None:
    registry.connection(settings).hset(keys.ARTIFACT_OWNERS, job_id, json.dumps({"owner": owner, "kind": kind}))


def owner_record(settings: Settings, job_id: str) -> dict[str, Any] | None:
    raw = registry.connection(settings).hget(keys.ARTIFACT_OWNERS, job_id)
    return json.loads(raw) if raw else None


def list_files(settings: Settings, job_id: str) -> list[dict[str, Any]]:
    return registry.store(settings).list_files(artifacts_key(job_id))
