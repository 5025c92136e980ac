"""The shared file store: model weights, datasets that jobs register, job artifacts (no torch).

Everything another host may need lives here, under keys such as ``models/<name>/<version>/config.json`` or
``artifacts/<job id>/influence.csv``. The store is any fsspec URL (``EXPLAINQ_STORE``): a local directory by default
(``$EXPLAINQ_HOME/store``), a path on a shared mount, ``s3://bucket/prefix``, ``gs://...``.

Writes are safe across hosts: on file systems a directory is uploaded under a fresh temporary key and then
renamed, on other stores its files go straight to their key (see ``Store.put_dir``), and readers only ever see keys
that the registry or a finished job names. Model and dataset versions are immutable (a replacement is a new
version key, and ``put_dir`` refuses a key that exists), so a host's local copy of a key never goes stale.

Reading: ``local_dir(key)`` gives a local directory with the key's files. A store on a local or mounted file
system is read in place; any other store (or every store, with ``EXPLAINQ_STORE_CACHE=always``) is copied once
into ``$EXPLAINQ_HOME/cache/store/<key>`` and reused from there.
"""

from __future__ import annotations

import mimetypes
import os
import posixpath
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()
_COMPLETE = ".complete"  # written last into a local cache copy: a copy without it is partial and is redone


class StoreError(Exception):
    """A key that does not exist, a version key that does already, or a name that would escape its prefix."""


def new_version() -> str:
    """A sortable, globally unique version id (no PIDs: hosts share the store)."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:12]


def clean_key(*parts: str) -> str:
    """Join parts into a relative key inside the store; refuses ``..`` that would leave it, NUL and empty
    names. Leading and trailing slashes are dropped, so an absolute part is read as relative to the store."""
    kept = [str(p).strip("/") for p in parts if str(p).strip("/")]
    joined = posixpath.join(*kept) if kept else ""
    norm = posixpath.normpath(joined) if joined else ""
    if not norm or norm == "." or norm.startswith("../") or norm == ".." or "\x00" in norm:
        raise StoreError(f"invalid store key {joined!r}")
    return norm


def media_type(name: str) -> str:
    guessed, _ = mimetypes.guess_type(name)
    if guessed:
        return guessed
    suffix = Path(name).suffix.lower()
    return {".jsonl": "application/x-ndjson", ".npy": "application/octet-stream",
            ".npz": "application/octet-stream", ".pt": "application/octet-stream",
            ".safetensors": "application/octet-stream", ".txt": "text/plain",
            ".csv": "text/csv", ".tsv": "text/tab-separated-values"}.get(suffix, "application/octet-stream")


class Store:
    def __init__(self, url: str, cache_dir: Path, cache_mode: str = "auto", **storage_options: Any):
        if cache_mode not in ("auto", "always"):
            raise ValueError("EXPLAINQ_STORE_CACHE must be 'auto' or 'always'")
        self.url = url
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/") or "/"
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        self.in_place = self.local and cache_mode == "auto"
        self.cache_dir = Path(cache_dir)
        if self.local:
            self.fs.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # ---- keys
    def full(self, key: str) -> str:
        return posixpath.join(self.root, clean_key(key))

    def exists(self, key: str) -> bool:
        return self.fs.exists(self.full(key))

    def isdir(self, key: str) -> bool:
        return self.fs.isdir(self.full(key))

    # ---- writing
    def put_file(self, local: Path, key: str) -> None:
        """Upload one file; readers never see a partial file (temporary name, then rename on file systems)."""
        target = self.full(key)
        self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
        if self.local:
            tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            self.fs.put_file(str(local), tmp)
            os.replace(tmp, target)
        else:  # object stores: a single PUT is atomic
            self.fs.put_file(str(local), target)

    def put_bytes(self, data: bytes, key: str) -> None:
        target = self.full(key)
        self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
        if self.local:
            tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        else:
            self.fs.pipe_file(target, data)

    def put_dir(self, local: Path, key: str) -> None:
        """Upload a directory tree to ``key``, which must not exist yet (version keys are fresh): StoreError
        if anything is there already, and the existing files are left as they were."""
        local = Path(local)
        if not local.is_dir():
            raise StoreError(f"{local} is not a directory")
        target = self.full(key)
        if self.fs.exists(target):
            raise StoreError(f"{key!r} already exists in the store; a version is never overwritten")
        if self.local:
            # Copy into a staging directory, then rename: readers see the whole version or none of it.
            # The rename is the real guard, atomic on one file system: it fails when another writer put
            # a non-empty directory or a file at the key after the check above. (POSIX rename replaces an
            # empty directory, so only an empty version racing an empty version could slip through.)
            staging = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                shutil.copytree(local, staging, symlinks=False)
                os.makedirs(posixpath.dirname(target), exist_ok=True)
                try:
                    os.rename(staging, target)
                except OSError as exc:
                    if os.path.lexists(target):
                        raise StoreError(f"{key!r} already exists in the store; a version is never "
                                         "overwritten") from exc
                    raise
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            return
        # Other stores (s3://, gs://, memory://) have no atomic rename: fsspec's mv is a copy then a delete,
        # object by object, and copying onto an existing directory nests the source inside it instead of
        # failing. Staging and moving would double the upload and still let the version appear file by file,
        # so the files go straight to the version key. That is safe for readers because nothing reads a
        # version before put_dir returns and the registry (or a finished job) names it. The check above and
        # the upload are not atomic: two hosts putting one key at the same moment could both pass it and
        # mix their files. Keys from new_version carry 48 random bits, so only a reused key can collide,
        # and the check refuses a key that was written before.
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            self.fs.put_file(str(path), posixpath.join(target, path.relative_to(local).as_posix()))

    def sync_dir(self, local: Path, key: str, uploaded: dict[str, tuple[int, int]] | None = None) -> None:
        """Mirror a local directory's files into ``key``, file by file (for a job's growing artifact directory).
        ``uploaded`` (store key -> size and mtime of the copy sent) skips files unchanged since an earlier call."""
        local = Path(local)
        if not local.is_dir():
            return
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            if path.name.endswith(".tmp") or ".tmp-" in path.name:
                continue
            target = clean_key(key, path.relative_to(local).as_posix())
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
            if uploaded is not None and uploaded.get(target) == stamp:
                continue
            self.put_file(path, target)
            if uploaded is not None:
                uploaded[target] = stamp

    # ---- reading
    def read_bytes(self, key: str) -> bytes:
        try:
            return self.fs.cat_file(self.full(key))
        except FileNotFoundError:
            raise StoreError(f"no {key!r} in the store") from None

    def read_text(self, key: str) -> str:
        return self.read_bytes(key).decode("utf-8")

    def open(self, key: str, mode: str = "rb") -> Any:
        return self.fs.open(self.full(key), mode)

    def size(self, key: str) -> int:
        return int(self.fs.size(self.full(key)))

    def iter_bytes(self, key: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        with self.open(key) as fh:
            while True:
                data = fh.read(chunk)
                if not data:
                    return
                yield data

    def list_files(self, key: str) -> list[dict[str, Any]]:
        """Files under ``key`` (recursively): name relative to ``key``, size in bytes, media type."""
        base = self.full(key)
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for path, info in sorted(found.items()):
            if info.get("type") == "directory":
                continue
            if not path.startswith(base.rstrip("/") + "/"):
                continue
            name = path[len(base.rstrip("/")) + 1:]
            if ".tmp-" in name:
                continue
            out.append({"name": name, "size": int(info.get("size") or 0), "media_type": media_type(name)})
        return out

    def list_dirs(self, key: str) -> list[str]:
        """Names of the immediate sub-directories of ``key``."""
        try:
            entries = self.fs.ls(self.full(key), detail=True)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries if e.get("type") == "directory"
                      and ".tmp-" not in e["name"])

    def local_dir(self, key: str) -> Path:
        """A local directory holding ``key``'s files: the store itself when it is a local file system, else a
        copy made once under the cache directory (safe with concurrent callers in this process and others)."""
        if self.in_place:
            path = Path(self.full(key))
            if not path.exists():
                raise StoreError(f"no {key!r} in the store")
            return path
        dest = self.cache_dir / clean_key(key)
        if (dest / _COMPLETE).exists():
            return dest
        with _lock_for(str(dest)):
            if (dest / _COMPLETE).exists():
                return dest
            if not self.exists(key):
                raise StoreError(f"no {key!r} in the store")
            staging = dest.with_name(f"{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
            staging.mkdir(parents=True)
            try:
                if self.isdir(key):
                    for item in self.list_files(key):
                        target = staging / item["name"]
                        target.parent.mkdir(parents=True, exist_ok=True)
                        self.fs.get_file(posixpath.join(self.full(key), item["name"]), str(target))
                else:
                    self.fs.get_file(self.full(key), str(staging / posixpath.basename(key)))
                (staging / _COMPLETE).write_text(key)
                if dest.exists() and not (dest / _COMPLETE).exists():  # a partial copy left by a crash
                    shutil.rmtree(dest, ignore_errors=True)
                try:
                    os.rename(staging, dest)
                except OSError:  # another process finished first
                    shutil.rmtree(staging, ignore_errors=True)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return dest

    # ---- deleting
    def delete(self, key: str) -> None:
        full = self.full(key)
        try:
            self.fs.rm(full, recursive=True)
        except FileNotFoundError:
            pass
        self.evict(key)

    def evict(self, key: str) -> None:
        """Drop this host's cached copy of ``key``."""
        shutil.rmtree(self.cache_dir / clean_key(key), ignore_errors=True)


def _lock_for(name: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(name, threading.Lock())


_STORES: dict[tuple[str, str, str], Store] = {}


def get_store(settings: Any) -> Store:
    """The store named by the settings (one instance per URL and cache directory in a process)."""
    key = (settings.store_url, str(settings.store_cache_dir), settings.store_cache_mode)
    store = _STORES.get(key)
    if store is None:
        store = _STORES[key] = Store(settings.store_url, settings.store_cache_dir, settings.store_cache_mode)
    return store
