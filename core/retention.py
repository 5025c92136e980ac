"""``explainq gc``: delete files nobody can reach any more (no torch).

- the artifacts and stored results of jobs whose record has expired from Redis (results follow ``EXPLAINQ_RESULT_TTL_S`` /
  ``EXPLAINQ_FAILURE_TTL_S``), and their owner records; never those of a job its owner keeps (``explainq:kept``,
  ``POST /jobs/{id}/keep``), nor of a kept fan-out's shards and reduce step;
- model and dataset versions that were replaced or deleted more than ``grace_s`` ago (a worker may still be loading
  one for a job that started before the replacement), and versions that never got registered (an upload whose
  registration failed) once they are older than ``grace_s``;
- gradient features whose model versions are all gone, and shared features and evaluation caches not used for
  ``EXPLAINQ_CACHE_TTL_S`` (``core/lastuse.py``), and the claims on them of jobs whose record has expired;
- on this host: scratch directories of jobs that no longer exist, and cached copies of store keys that are gone
  from the store (a copy of an object still stored is kept, whether or not the registry names it).

Safe to run from several hosts at once: every step re-checks before it deletes, and deleting twice is harmless.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from calendar import timegm
from pathlib import Path
from typing import Any

from core import keys, lastuse, registry, results
from core.artifacts import artifacts_key
from core.filestore import get_store
from core.keys import JOB_PREFIX
from core.settings import Settings

log = logging.getLogger("explainq.gc")


def _version_age_s(version: str, now: float) -> float | None:
    """Age of a version id made by ``store.new_version`` (``YYYYmmddTHHMMSS-<hex>``)."""
    try:
        return now - timegm(time.strptime(version.split("-", 1)[0], "%Y%m%dT%H%M%S"))
    except ValueError:
        return None


def collect(settings: Settings, grace_s: float = 3600.0, now: float | None = None) -> dict[str, Any]:
    """One pass; returns what it removed."""
    now = time.time() if now is None else now
    r = registry.connection(settings)
    store = get_store(settings)
    removed: dict[str, Any] = {"artifacts": _remove_expired_artifacts(settings, r, store)}
    referenced = _referenced_locations(settings)
    removed["versions"] = _remove_released_versions(r, store, referenced, grace_s, now)
    removed["versions"] += _remove_unregistered_versions(settings, store, referenced, grace_s, now)
    removed["scratch"] = _remove_scratch(settings, r, grace_s, now)
    removed["features"] = _remove_orphaned_features(store, referenced)
    removed["unused"] = _remove_unused_shared(settings, store, now)
    removed["claims"] = _remove_expired_claims(r, store)
    removed["cache"] = _remove_stale_cache(settings, r, store, referenced)
    if any(removed.values()):
        log.info("gc removed %s", {k: len(v) for k, v in removed.items()})
    return removed


def _remove_expired_artifacts(settings: Settings, r: Any, store: Any) -> list[str]:
    """Step 1: the artifacts, stored results (core/results.py) and owner records of jobs that no longer exist;
    returns their job ids."""
    removed = []
    job_dirs = store.list_dirs("artifacts")
    stored_results = set(results.stored_ids(settings))
    owners = {k.decode() for k in r.hkeys(keys.ARTIFACT_OWNERS)}
    kept = {k.decode() for k in r.hkeys(keys.KEPT)}
    for job_id in sorted(set(job_dirs) | owners | stored_results):
        if job_id in kept or job_id.split("-", 1)[0] in kept:
            continue  # its owner keeps it (a kept fan-out's shards and reduce step with it)
        if r.exists(JOB_PREFIX + job_id):
            continue
        if job_id in job_dirs:
            store.delete(artifacts_key(job_id))
        if job_id in stored_results:
            results.delete(settings, job_id)
        r.hdel(keys.ARTIFACT_OWNERS, job_id)
        removed.append(job_id)
    return removed


def _referenced_locations(settings: Settings) -> set[str]:
    """Store keys of every registered model and dataset version."""
    referenced = set()
    for section in registry.SECTIONS:
        for entry in registry._list(settings, section).values():
            if entry.get("location"):
                referenced.add(entry["location"])
    return referenced


def _remove_released_versions(r: Any, store: Any, referenced: set[str], grace_s: float, now: float) -> list[str]:
    """Step 2: versions released by a replacement or a deletion more than ``grace_s`` ago; returns their keys."""
    removed = []
    for raw_key, _score in r.zrangebyscore(registry.keys.STORE_ORPHANS, 0, now - grace_s, withscores=True):
        key = raw_key.decode()
        if key not in referenced:
            store.delete(key)
            removed.append(key)
        r.zrem(registry.keys.STORE_ORPHANS, raw_key)
    return removed


def _remove_unregistered_versions(settings: Settings, store: Any, referenced: set[str], grace_s: float,
                                  now: float) -> list[str]:
    """Step 3: versions never registered (their upload's registration failed or its process died) once older than
    ``grace_s``; returns their keys."""
    removed = []
    for section in registry.SECTIONS:
        for name in store.list_dirs(section):
            for version in store.list_dirs(f"{section}/{name}"):
                key = f"{section}/{name}/{version}"
                if _unregistered_and_old(settings, key, version, referenced, grace_s, now):
                    store.delete(key)
                    removed.append(key)
    return removed


def _unregistered_and_old(settings: Settings, key: str, version: str, referenced: set[str], grace_s: float,
                          now: float) -> bool:
    age = _version_age_s(version, now)
    if key in referenced or age is None or age < grace_s:
        return False
    if registry.connection(settings).zscore(registry.keys.STORE_ORPHANS, key) is not None:
        return False  # released recently: step 2 deletes it after its grace period
    return True


def _remove_scratch(settings: Settings, r: Any, grace_s: float, now: float) -> list[str]:
    """Step 4, this host: scratch directories of jobs that are gone; returns their names."""
    removed: list[str] = []
    work = settings.work_dir
    if not work.is_dir():
        return removed
    for path in work.iterdir():
        if not path.is_dir() or now - path.stat().st_mtime < grace_s or path.name.startswith(("demo-", "lora-")):
            continue  # demo-*: this host's demo build inputs, reused by the next build
        if not path.name.startswith("conve-") and r.exists(JOB_PREFIX + path.name):
            continue  # a job that still exists (a failed one may be retried from its scratch)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


FEATURES = "features"          # models.explain.features.PREFIX
FEATURE_MODELS = "models.json"  # workers.jobs.featurize.MODELS_FILE: the model versions a feature key belongs to


def _remove_orphaned_features(store: Any, referenced: set[str]) -> list[str]:
    """Step 3b: stored gradient features (``POST /featurize``) whose model versions are all gone, from the
    registry and from the store (so a version inside its grace period keeps its features); returns the keys.
    A feature key with no record of its model is left alone."""
    removed = []
    for key in store.list_dirs(FEATURES):
        record = f"{FEATURES}/{key}/{FEATURE_MODELS}"
        if not store.exists(record):
            continue
        try:
            locations = json.loads(store.read_bytes(record))
        except ValueError:
            continue
        if any(loc in referenced or store.exists(loc) for loc in locations):
            continue
        store.delete(f"{FEATURES}/{key}")
        lastuse.forget(store, f"{FEATURES}/{key}")
        removed.append(f"{FEATURES}/{key}")
    return removed


def _remove_unused_shared(settings: Settings, store: Any, now: float) -> list[str]:
    """Step 3c: shared features and evaluation caches (core/lastuse.py) not used for ``EXPLAINQ_CACHE_TTL_S``;
    an entry with no record of its use gets one now (its clock starts). Returns the keys removed."""
    removed: list[str] = []
    if settings.cache_ttl_s <= 0:
        return removed
    for family in lastuse.FAMILIES:
        for name in store.list_dirs(family):
            entry = f"{family}/{name}"
            used = lastuse.last_used(store, entry)
            if used is None:
                lastuse.touch(store, [entry], now)
            elif now - used > settings.cache_ttl_s:
                store.delete(entry)
                lastuse.forget(store, entry)
                removed.append(entry)
    return removed


def _remove_expired_claims(r: Any, store: Any) -> list[str]:
    """Step 3d: tenants' claims on shared entries (core/lastuse.py) made by jobs whose record has expired (a job
    its owner keeps keeps its claims); returns ``<owner>/<job id>`` of each released."""
    kept = {k.decode() for k in r.hkeys(keys.KEPT)}
    removed = []
    for owner in lastuse.owners_with_claims(store):
        for job_id in lastuse.claimed_jobs(store, owner):
            if job_id in kept or job_id.split("-", 1)[0] in kept or r.exists(JOB_PREFIX + job_id):
                continue
            lastuse.release(store, owner, [job_id])
            removed.append(f"{owner}/{job_id}")
    return removed


def _remove_stale_cache(settings: Settings, r: Any, store: Any, referenced: set[str]) -> list[str]:
    """Step 4, this host: cached copies of store keys that are gone; returns the keys.

    A copy goes only once the object it copies has left the store: a registered version, a released one still in
    its grace period (a job may be loading it) and any other key still stored (gradient-feature segments, a job's
    checkpoint) keep their copy, so a second pass deletes nothing and nothing is downloaded again. Objects are
    immutable (``core.filestore``), so a kept copy is never stale; when retention deletes an object the copy goes
    at the next pass on each host (at once on the host that deletes it)."""
    removed = []
    cache = settings.store_cache_dir
    for key_dir in _cached_keys(cache):
        key = key_dir.relative_to(cache).as_posix()
        if key.startswith("artifacts/"):
            job_id = key.split("/")[1]
            gone = not r.exists(JOB_PREFIX + job_id) and not store.exists(artifacts_key(job_id))
        else:
            gone = key not in referenced and not store.exists(key)
        if gone:
            shutil.rmtree(key_dir, ignore_errors=True)
            removed.append(key)
    return removed


def _cached_keys(cache: Path) -> list[Path]:
    """Directories of completed cached copies (each holds a ``.complete`` marker)."""
    if not cache.is_dir():
        return []
    return sorted(marker.parent for marker in cache.rglob(".complete"))
