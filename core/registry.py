"""The model and dataset registry, in Redis, shared by every API process and worker on every host (no torch).

Two Redis hashes map a name to a JSON record:

- ``explainq:registry:models``: ``{"name", "kind", "owner", "created_at", "location", "loader", "parameters",
  "preload", "meta", "digest"}``; ``location`` is the store key of an immutable version directory
  (``models/<name>/<version>``), so replacing a model never changes files a worker is reading;
- ``explainq:registry:datasets``: ``{"name", "kind", "owner", "created_at", "location" | "path", "meta"}``: either a
  store key (a dataset a job generated) or an absolute path inside the data roots (a directory users manage on a
  shared mount), or neither for data shipped in a package (digits).

``digest`` is the SHA-256 of a version's files (``tree_digest``), computed once when the version is registered from
files it uploads or names in the store (a dataset referenced in place has none: its files are the owner's to
change). A record written before digests existed gets one the first time a job asks (``ensure_digest``), written
back to the record only while it still names that version, so a job never hashes weights that were hashed before.

Ownership: every record has an owner, the API key's name (demo data belongs to ``system``). Every key may use any
model; only the owner may replace or delete it. The check and the write are one Lua script, so two hosts registering
one name at once cannot both win. A replaced or deleted version is queued for ``explainq gc``.

An existing ``$EXPLAINQ_HOME/registry.json`` (the single-host format of earlier versions) is imported once, its
model directories copied into the store, and renamed to ``registry.json.imported``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis as redis_lib

from core import keys
from core.filestore import Store, StoreError, clean_key, get_store, new_version
from core.settings import Settings

log = logging.getLogger("explainq.registry")

SECTIONS = ("models", "datasets")
SYSTEM = "system"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class OwnershipError(Exception):
    """The name belongs to another owner: it may be used, not replaced or deleted."""

    def __init__(self, section: str, name: str, owner: str):
        super().__init__(f"{section[:-1]} {name!r} belongs to {owner!r}; only its owner may replace or delete it")
        self.section, self.name, self.owner = section, name, owner


# The names of the service's own data and demo models: the shipped graphs, the datasets and models demo preparation
# registers, and the CIFAR datasets it registers when found. Only ``system`` registers them, so such a name always
# means the service's (a tenant cannot make ``umls`` mean three triples of theirs, nor take a demo model's name
# before the demo step runs). tests/test_reserved_names.py checks the lists against the demo steps.
RESERVED: dict[str, frozenset[str]] = {
    "datasets": frozenset({"nations", "umls", "kinships", "digits", "digits-tensors", "cifar10", "cifar100",
                           "lora-demo", "news-synthetic", "news-synthetic-poisoned", "topics-text"}),
    "models": frozenset({"conve-nations-demo", "conve-umls-demo", "conve-kinships-demo", "digits-cnn-demo",
                         "nrms-minilm-demo", "nrms-minilm-poisoned-demo", "nrms-word-demo", "naml-demo",
                         "minilm-topics-demo"}),
}


class ReservedNameError(OwnershipError):
    """The name is one of the service's own (:data:`RESERVED`): only ``system`` registers it."""

    def __init__(self, section: str, name: str, holder: str | None = None):
        kind = section[:-1]
        msg = (f"{name!r} is reserved: it names the service's own {kind} (shipped data or a demo model); choose "
               "another name")
        if holder is not None:
            msg = (f"{kind} {name!r} is reserved for the service's own {kind} but is registered by {holder!r} "
                   f"(from before the name was reserved): delete it ({holder!r}'s key, DELETE /{section}/{name}) "
                   "so the service can register its own")
        Exception.__init__(self, msg)
        self.section, self.name, self.owner = section, name, holder or SYSTEM


def is_reserved(section: str, name: str) -> bool:
    return name in RESERVED[section]


# Set the record unless another owner holds the name. Returns {1, previous JSON or ""} or {0, other owner}.
_PUT_IF_OWNER = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local ok, e = pcall(cjson.decode, cur)
  local owner = 'system'
  if ok and type(e) == 'table' and type(e['owner']) == 'string' then owner = e['owner'] end
  if owner ~= ARGV[3] then return {0, owner} end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if cur then
  local ok, e = pcall(cjson.decode, cur)
  if ok and type(e) == 'table' and type(e['location']) == 'string' and e['location'] ~= ARGV[4] then
    redis.call('ZADD', KEYS[2], ARGV[5], e['location'])
  end
  return {1, cur}
end
return {1, ''}
"""

# Delete the record if the caller owns it. Returns {1, JSON} / {0, owner} / {-1, ''} (absent).
_DELETE_IF_OWNER = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return {-1, ''} end
local ok, e = pcall(cjson.decode, cur)
local owner = 'system'
if ok and type(e) == 'table' and type(e['owner']) == 'string' then owner = e['owner'] end
if owner ~= ARGV[2] then return {0, owner} end
redis.call('HDEL', KEYS[1], ARGV[1])
if ok and type(e) == 'table' and type(e['location']) == 'string' then
  redis.call('ZADD', KEYS[2], ARGV[3], e['location'])
end
return {1, cur}
"""

_CLIENTS: dict[str, redis_lib.Redis] = {}
_CLIENTS_LOCK = threading.Lock()
_IMPORTED: set[str] = set()


def connection(settings: Settings) -> redis_lib.Redis:
    """A Redis client for the settings' URL, shared in this process; imports a legacy registry.json once."""
    url = settings.redis_url or DEFAULT_REDIS_URL
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(url)
        if client is None:
            client = _CLIENTS[url] = redis_lib.Redis.from_url(
                url, socket_connect_timeout=settings.redis_timeout_s, socket_timeout=settings.redis_timeout_s * 5,
                health_check_interval=30, socket_keepalive=True)
    marker = f"{url}|{settings.home}"
    if marker not in _IMPORTED:
        _IMPORTED.add(marker)
        try:
            import_legacy(settings, client)
        except Exception:
            _IMPORTED.discard(marker)
            raise
    return client


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _decode(raw: bytes | str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    entry = json.loads(raw)
    entry.setdefault("owner", SYSTEM)
    entry.setdefault("meta", {})
    return entry


def _put(settings: Settings, section: str, name: str, entry: dict[str, Any], owner: str,
         client: redis_lib.Redis | None = None) -> dict[str, Any] | None:
    """Write the record if ``owner`` may; returns the record it replaced (or None)."""
    if owner != SYSTEM and is_reserved(section, name):
        raise ReservedNameError(section, name)
    r = client or connection(settings)
    res = r.eval(_PUT_IF_OWNER, 2, keys.registry(section), keys.STORE_ORPHANS, name, json.dumps(entry, sort_keys=True), owner,
                 entry.get("location") or "", time.time())
    status, other = int(res[0]), res[1]
    if status == 0:
        raise OwnershipError(section, name, other.decode() if isinstance(other, bytes) else str(other))
    return _decode(other) if other else None


def tree_digest(path: str | Path) -> str:
    """SHA-256 over a directory's files: each file's path relative to it and the SHA-256 of its bytes, in path order
    (a single file: its bytes). Hidden files (``.complete`` markers) are left out."""
    root = Path(path)
    files = [root] if root.is_file() else sorted(
        p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    outer = hashlib.sha256()
    for file in files:
        inner = hashlib.sha256()
        with open(file, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                inner.update(chunk)
        name = file.name if file == root else file.relative_to(root).as_posix()
        outer.update(f"{name}\0{inner.hexdigest()}\n".encode())
    return outer.hexdigest()


def ensure_digest(settings: Settings, section: str, entry: dict[str, Any]) -> str | None:
    """The record's digest: the one recorded, or (a record of an earlier version) computed once from its store
    version and recorded. None for a dataset referenced in place or packaged, or files that are gone."""
    if entry.get("digest"):
        return entry["digest"]
    if not entry.get("location"):
        return None
    try:
        digest = tree_digest(local_path(settings, entry))
    except (FileNotFoundError, OSError):
        return None
    r = connection(settings)
    with r.pipeline(transaction=True) as pipe:
        try:  # written back only while the record still names the version hashed
            pipe.watch(keys.registry(section))
            current = _decode(pipe.hget(keys.registry(section), entry["name"]))
            if current is not None and (current.get("location"), current.get("created_at")) == \
                    (entry.get("location"), entry.get("created_at")):
                pipe.multi()
                pipe.hset(keys.registry(section), entry["name"], json.dumps({**current, "digest": digest},
                                                                            sort_keys=True))
                pipe.execute()
        except redis_lib.WatchError:
            pass
    return digest


def version_of(entry: dict[str, Any]) -> str | None:
    """A record's version: the last part of its store key (``models/<name>/<version>``), else its creation time."""
    location = entry.get("location")
    return location.rstrip("/").rsplit("/", 1)[-1] if location else entry.get("created_at")


def check_owner(settings: Settings, section: str, name: str, owner: str) -> dict[str, Any] | None:
    """The existing record, if any; OwnershipError when another owner holds the name, ReservedNameError when the
    name is reserved and ``owner`` is not ``system``."""
    if owner != SYSTEM and is_reserved(section, name):
        raise ReservedNameError(section, name)
    entry = _get(settings, section, name)
    if entry is not None and entry["owner"] != owner:
        raise OwnershipError(section, name, entry["owner"])
    return entry


def system_entry(settings: Settings, section: str, name: str) -> dict[str, Any] | None:
    """The service's own record of the reserved ``name`` (demo preparation): None when there is none yet; a
    ReservedNameError when another owner holds it, registered before the name was reserved, so that the demo step
    fails saying so rather than skipping the name or using a tenant's data as the service's."""
    entry = _get(settings, section, name)
    if entry is not None and entry["owner"] != SYSTEM:
        raise ReservedNameError(section, name, holder=entry["owner"])
    return entry


def register_model(
    settings: Settings,
    name: str,
    *,
    kind: str,
    loader: str,
    path: str | Path | None = None,
    location: str | None = None,
    parameters: int | None = None,
    meta: dict[str, Any] | None = None,
    owner: str = SYSTEM,
    preload: bool = False,
) -> dict[str, Any]:
    """Register (or, for its owner, replace) a model. ``path``: a local directory uploaded into the store as a new
    version; ``location``: a version already in the store. Raises OwnershipError for another owner's name."""
    check_owner(settings, "models", name, owner)  # fail before uploading anything
    store = get_store(settings)
    uploaded = None
    if location is None:
        if path is None:
            raise ValueError("register_model needs a path or a store location")
        digest = tree_digest(path)
        location = uploaded = clean_key("models", name, new_version())
        store.put_dir(Path(path), location)
    else:
        digest = tree_digest(store.local_dir(location))
    entry = {"name": name, "kind": kind, "loader": loader, "location": location, "parameters": parameters,
             "meta": meta or {}, "owner": owner, "preload": bool(preload), "created_at": _now_iso(),
             "digest": digest}
    try:
        _put(settings, "models", name, entry, owner)
    except BaseException:
        if uploaded is not None:
            store.delete(uploaded)
        raise
    return dict(entry)


def register_dataset(
    settings: Settings,
    name: str,
    *,
    kind: str,
    path: str | Path | None = None,
    meta: dict[str, Any] | None = None,
    owner: str = SYSTEM,
    upload: bool = False,
    location: str | None = None,
) -> dict[str, Any]:
    """Register a dataset: a directory users manage under the data roots (``path``, referenced in place), a local
    directory copied into the store (``upload=True``), a store key (``location``), or nothing (packaged data)."""
    check_owner(settings, "datasets", name, owner)
    entry: dict[str, Any] = {"name": name, "kind": kind, "meta": meta or {}, "owner": owner,
                             "created_at": _now_iso()}
    uploaded = None
    if location is not None:
        entry["location"] = location
        entry["digest"] = tree_digest(get_store(settings).local_dir(location))
    elif path is not None and upload:
        entry["digest"] = tree_digest(path)
        entry["location"] = uploaded = clean_key("datasets", name, new_version())
        get_store(settings).put_dir(Path(path), uploaded)
    elif path is not None:
        entry["path"] = str(Path(path).expanduser().resolve())
    try:
        _put(settings, "datasets", name, entry, owner)
    except BaseException:
        if uploaded is not None:
            get_store(settings).delete(uploaded)
        raise
    return dict(entry)


def _get(settings: Settings, section: str, name: str) -> dict[str, Any] | None:
    return _decode(connection(settings).hget(keys.registry(section), name))


def get_model(settings: Settings, name: str) -> dict[str, Any] | None:
    return _get(settings, "models", name)


def get_dataset(settings: Settings, name: str) -> dict[str, Any] | None:
    return _get(settings, "datasets", name)


def _list(settings: Settings, section: str) -> dict[str, dict[str, Any]]:
    raw = connection(settings).hgetall(keys.registry(section))
    return {k.decode(): _decode(v) for k, v in sorted(raw.items())}


def list_models(settings: Settings) -> dict[str, dict[str, Any]]:
    return _list(settings, "models")


def list_datasets(settings: Settings) -> dict[str, dict[str, Any]]:
    return _list(settings, "datasets")


def delete(settings: Settings, section: str, name: str, owner: str) -> dict[str, Any] | None:
    """Delete ``name`` if ``owner`` owns it: the record, returned; None when absent; OwnershipError otherwise.
    Its store files are released to ``explainq gc`` (a worker may still be loading them)."""
    res = connection(settings).eval(_DELETE_IF_OWNER, 2, keys.registry(section), keys.STORE_ORPHANS, name, owner,
                                    time.time())
    status, value = int(res[0]), res[1]
    if status == -1:
        return None
    if status == 0:
        raise OwnershipError(section, name, value.decode() if isinstance(value, bytes) else str(value))
    return _decode(value)


def unregister(settings: Settings, section: str, name: str) -> None:
    """Remove a record whatever its owner (service-internal clean-up, not reachable from the API)."""
    entry = _get(settings, section, name)
    if entry is None:
        return
    delete(settings, section, name, entry["owner"])


# ------------------------------------------------------------------------------------------------ files
def local_path(settings: Settings, entry: dict[str, Any]) -> Path:
    """A local path of the record's files: the store version (in place or this host's cached copy), or the
    dataset's directory under the data roots."""
    if entry.get("location"):
        try:
            return get_store(settings).local_dir(entry["location"])
        except StoreError:
            raise FileNotFoundError(f"{entry.get('name')!r}: its files are missing from the store") from None
    if entry.get("path"):
        return Path(entry["path"])
    raise FileNotFoundError(f"{entry.get('name')!r} has no files")


# Older name kept for callers that resolve a registry record to its directory.
absolute_path = local_path


def read_file(settings: Settings, entry: dict[str, Any], relname: str) -> bytes:
    """One small file of a record (a config, an id dictionary) without copying the whole directory."""
    if entry.get("location"):
        return get_store(settings).read_bytes(clean_key(entry["location"], relname))
    return (local_path(settings, entry) / relname).read_bytes()


def store(settings: Settings) -> Store:
    return get_store(settings)


# ------------------------------------------------------------------------------------------------ legacy import
@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def import_legacy(settings: Settings, client: redis_lib.Redis) -> int:
    """Import ``$EXPLAINQ_HOME/registry.json`` into Redis once (names already in Redis are kept)."""
    path = settings.home / "registry.json"
    if not path.is_file():
        return 0
    with _file_lock(settings.home / ".registry-import.lock"):
        if not path.is_file():
            return 0
        data = json.loads(path.read_text())
        count = 0
        for name, old in data.get("models", {}).items():
            if client.hexists(keys.registry("models"), name):
                continue
            directory = Path(old["path"])
            directory = directory if directory.is_absolute() else settings.home / directory
            if not directory.is_dir():
                log.warning("registry.json: model %s has no directory at %s; not imported", name, directory)
                continue
            location = clean_key("models", name, new_version())
            get_store(settings).put_dir(directory, location)
            entry = {"name": name, "kind": old.get("kind"), "loader": old.get("loader"), "location": location,
                     "parameters": old.get("parameters"), "meta": old.get("meta", {}), "owner": SYSTEM,
                     "preload": True, "created_at": old.get("created_at") or _now_iso()}
            _put(settings, "models", name, entry, SYSTEM, client)
            count += 1
        for name, old in data.get("datasets", {}).items():
            if client.hexists(keys.registry("datasets"), name):
                continue
            p = Path(old["path"])
            entry = {"name": name, "kind": old.get("kind"), "meta": old.get("meta", {}), "owner": SYSTEM,
                     "path": str(p if p.is_absolute() else (settings.home / p).resolve()),
                     "created_at": old.get("created_at") or _now_iso()}
            _put(settings, "datasets", name, entry, SYSTEM, client)
            count += 1
        os.replace(path, path.with_name("registry.json.imported"))
        log.info("imported %d registry entries from %s into Redis", count, path)
        return count
