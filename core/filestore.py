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

Every call that reaches the store is bounded and retried: one attempt may go ``timeout_s`` without an answer (a
transfer gets one more second per MiB it moves, and a streamed read ``timeout_s`` per chunk), an attempt that times
out or fails as an outage would (a refused or reset connection, a timeout, an object store's service error) is
retried after 0.5 s, 1 s, 2 s, ... up to ``retries`` times, and then the call raises :class:`StoreUnavailable`
(``EXPLAINQ_STORE_TIMEOUT_S``, ``EXPLAINQ_STORE_RETRIES``). A store's own answers (no such key, no permission) are
never retried. A hung call is left behind in its daemon thread; the caller goes on. s3fs and gcsfs also get their
own request timeouts (:func:`store_options`), so their connections do not hang in the first place.
"""

from __future__ import annotations

import errno
import io
import logging
import mimetypes
import os
import posixpath
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec

log = logging.getLogger("explainq.store")

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()
_COMPLETE = ".complete"  # written last into a local cache copy: a copy without it is partial and is redone


class StoreError(Exception):
    """A key that does not exist, a version key that does already, or a name that would escape its prefix."""


class StoreUnavailable(Exception):
    """The store did not answer (timed out, refused, failed as an outage does) on every attempt of a call. Not a
    :class:`StoreError`: nothing is known about the key. A job that meets it fails with ``store_unavailable``, the
    API answers 503 with that code. The message names the operation and the key, never the store's address."""

    def __init__(self, operation: str, key: str, attempts: int, cause: BaseException):
        self.operation, self.key, self.attempts = operation, key, attempts
        self.cause = type(cause).__name__
        super().__init__(f"the store did not answer ({operation} {key!r}: {self.cause}, {attempts} attempt"
                         f"{'s' if attempts != 1 else ''})")


class StoreTimeout(TimeoutError):
    """One store call went longer than its time without an answer."""


CHUNK = 1 << 20  # bytes per bounded read of a streamed download
MIN_RATE = 1 << 20  # bytes per second a transfer is allowed at the least, on top of the timeout
BACKOFF_S = 0.5  # the first pause before a retry; doubled after each retry, at most BACKOFF_CAP_S
BACKOFF_CAP_S = 8.0
# Local file-system errors that mean "the mount is not answering" (NFS, FUSE), not "this path is wrong".
_OUTAGE_ERRNOS = {errno.ETIMEDOUT, errno.EIO, errno.ESTALE, errno.ECONNRESET, errno.ECONNREFUSED,
                  errno.ECONNABORTED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.EAGAIN}
# Where the errors of an object store's client come from (their top-level module).
_CLIENT_MODULES = {"botocore", "aiobotocore", "boto3", "s3fs", "gcsfs", "aiohttp", "google", "requests",
                   "urllib3", "http", "ssl", "fsspec", "asyncio"}
# A store's answers: never retried, whatever the store.
_ANSWERS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError,
            StoreError, ValueError, TypeError, KeyError)


def store_options(protocol: str, timeout_s: float, retries: int) -> dict[str, Any]:
    """fsspec options that give an object store's client its own timeouts: botocore's connect and read timeouts
    for s3fs, aiohttp's request timeout for gcsfs. Other stores get none (the bounded calls still apply)."""
    if protocol in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": timeout_s, "read_timeout": timeout_s,
                                  "retries": {"max_attempts": retries + 1, "mode": "standard"}}}
    if protocol in ("gs", "gcs"):
        return {"requests_timeout": timeout_s}
    return {}


def bounded(fn: Callable[..., Any], timeout_s: float | None, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a daemon thread; :class:`StoreTimeout` when it has not returned in
    ``timeout_s`` (None or 0: no bound). The thread of a call that never returns is left behind."""
    if not timeout_s or timeout_s <= 0:
        return fn(*args, **kwargs)
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="explainq-store-call", daemon=True).start()
    if not done.wait(timeout_s):
        raise StoreTimeout(f"no answer in {timeout_s:.1f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


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


class _BoundedReader(io.RawIOBase):
    """A store file opened for reading whose every read is bounded (``Store.open``): a stalled download raises
    :class:`StoreUnavailable` instead of hanging its reader. No retry mid-stream: the caller starts again."""

    def __init__(self, store: Store, fh: Any, key: str):
        self.store, self.fh, self.key = store, fh, key

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(getattr(self.fh, "seekable", lambda: False)())

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.fh.seek(offset, whence)

    def tell(self) -> int:
        return self.fh.tell()

    def _read(self, n: int) -> bytes:
        try:
            return bounded(self.fh.read, self.store.timeout_s, n)
        except BaseException as exc:
            if self.store.is_outage(exc):
                raise StoreUnavailable("read", self.key, 1, exc) from exc
            raise

    def readinto(self, buffer: Any) -> int:
        data = self._read(min(len(buffer), CHUNK))
        buffer[:len(data)] = data
        return len(data)

    def readall(self) -> bytes:
        parts = []
        while data := self._read(CHUNK):
            parts.append(data)
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed:
            try:
                self.fh.close()
            finally:
                super().close()


class Store:
    def __init__(self, url: str, cache_dir: Path, cache_mode: str = "auto", *, timeout_s: float = 30.0,
                 retries: int = 3, backoff_s: float = BACKOFF_S, **storage_options: Any):
        if cache_mode not in ("auto", "always"):
            raise ValueError("EXPLAINQ_STORE_CACHE must be 'auto' or 'always'")
        self.url = url
        self.timeout_s, self.retries, self.backoff_s = float(timeout_s), int(retries), float(backoff_s)
        protocol = fsspec.core.split_protocol(url)[0] or "file"
        options = {**store_options(protocol, self.timeout_s, self.retries), **storage_options}
        self.fs, root = fsspec.core.url_to_fs(url, **options)
        self.root = root.rstrip("/") or "/"
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        self.in_place = self.local and cache_mode == "auto"
        self.cache_dir = Path(cache_dir)
        if self.local:
            self._call("makedirs", "", self.fs.makedirs, self.root, exist_ok=True)

    # ---- bounded, retried calls
    def is_outage(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the store is not answering (retried), rather than answering no (raised as it is)."""
        if isinstance(exc, (TimeoutError, ConnectionError, StoreTimeout)):
            return True
        if isinstance(exc, _ANSWERS) or not isinstance(exc, Exception):
            return False
        if self.local:  # a file system: only the errors of a mount that stopped answering
            return isinstance(exc, OSError) and exc.errno in _OUTAGE_ERRNOS
        # an object store: what its client raises (s3fs and gcsfs turn service errors into OSError; connection
        # and protocol errors come from the HTTP libraries underneath), never the worker's own exceptions (a job
        # timeout, a shutdown) that happen to interrupt a store call
        return isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in _CLIENT_MODULES

    def _retrying(self, operation: str, key: str, attempt: Callable[[], Any]) -> Any:
        """``attempt()`` until it answers, at most ``1 + retries`` times with exponential backoff between them;
        :class:`StoreUnavailable` when every attempt met an outage."""
        delay = self.backoff_s
        for n in range(1, self.retries + 2):
            try:
                return attempt()
            except StoreUnavailable:
                raise
            except BaseException as exc:
                if not self.is_outage(exc):
                    raise
                if n > self.retries:
                    log.warning("store %s of %r failed %d times (%s); giving up", operation, key, n,
                                type(exc).__name__)
                    raise StoreUnavailable(operation, key, n, exc) from exc
                log.warning("store %s of %r failed (%s: %s); retrying in %.1f s", operation, key,
                            type(exc).__name__, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, BACKOFF_CAP_S)
        raise AssertionError("unreachable")

    def _call(self, operation: str, key: str, fn: Callable[..., Any], *args: Any, size: int = 0,
              **kwargs: Any) -> Any:
        """One store call, bounded (``timeout_s``, plus a second per MiB of ``size``) and retried."""
        timeout = self.timeout_s + size / MIN_RATE if self.timeout_s > 0 else None
        return self._retrying(operation, key, lambda: bounded(fn, timeout, *args, **kwargs))

    def check(self, timeout_s: float | None = None) -> str | None:
        """None when the store answers (its root listed within ``timeout_s``, by default the store's timeout),
        else the reason, without an address: one attempt, no retry (health checks and metrics)."""
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s or timeout_s)
        try:
            bounded(self.fs.exists, limit, self.root)
        except StoreTimeout:
            return f"store timed out ({limit:.1f} s)"
        except Exception as exc:
            return f"store unreachable ({type(exc).__name__})"
        return None

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # ---- keys
    def full(self, key: str) -> str:
        return posixpath.join(self.root, clean_key(key))

    def exists(self, key: str) -> bool:
        return self._call("exists", key, self.fs.exists, self.full(key))

    def isdir(self, key: str) -> bool:
        return self._call("isdir", key, self.fs.isdir, self.full(key))

    # ---- writing
    def put_file(self, local: Path, key: str) -> None:
        """Upload one file; readers never see a partial file (temporary name, then rename on file systems)."""
        target = self.full(key)
        self._call("write", key, self.fs.makedirs, posixpath.dirname(target), exist_ok=True)
        size = Path(local).stat().st_size
        if self.local:
            tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            self._call("write", key, self.fs.put_file, str(local), tmp, size=size)
            self._call("write", key, os.replace, tmp, target)
        else:  # object stores: a single PUT is atomic
            self._call("write", key, self.fs.put_file, str(local), target, size=size)

    def put_bytes(self, data: bytes, key: str) -> None:
        target = self.full(key)
        self._call("write", key, self.fs.makedirs, posixpath.dirname(target), exist_ok=True)
        if self.local:
            tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            self._call("write", key, _write_then_replace, tmp, target, data, size=len(data))
        else:
            self._call("write", key, self.fs.pipe_file, target, data, size=len(data))

    def put_dir(self, local: Path, key: str) -> None:
        """Upload a directory tree to ``key``, which must not exist yet (version keys are fresh): StoreError
        if anything is there already, and the existing files are left as they were."""
        local = Path(local)
        if not local.is_dir():
            raise StoreError(f"{local} is not a directory")
        target = self.full(key)
        if self._call("write", key, self.fs.exists, target):
            raise StoreError(f"{key!r} already exists in the store; a version is never overwritten")
        if self.local:
            size = sum(p.stat().st_size for p in local.rglob("*") if p.is_file())
            self._call("write", key, self._put_tree_in_place, local, key, target, size=size)
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
            self._call("write", key, self.fs.put_file, str(path),
                       posixpath.join(target, path.relative_to(local).as_posix()), size=path.stat().st_size)

    @staticmethod
    def _put_tree_in_place(local: Path, key: str, target: str) -> None:
        """``put_dir`` on a file system: copy into a staging directory, then rename, so readers see the whole
        version or none of it. The rename is the real guard, atomic on one file system: it fails when another
        writer put a non-empty directory or a file at the key after the check. (POSIX rename replaces an empty
        directory, so only an empty version racing an empty version could slip through.)"""
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
        """The whole file, read in bounded chunks (a stall, not a large file, is what times out), retried."""

        def attempt() -> bytes:
            with self._open_raw(key) as fh:
                return fh.readall()

        try:
            return self._retrying("read", key, attempt)
        except FileNotFoundError:
            raise StoreError(f"no {key!r} in the store") from None

    def read_text(self, key: str) -> str:
        return self.read_bytes(key).decode("utf-8")

    def _open_raw(self, key: str) -> _BoundedReader:
        return _BoundedReader(self, bounded(self.fs.open, self.timeout_s, self.full(key), "rb"), key)

    def open(self, key: str, mode: str = "rb") -> Any:
        """A file of the store; read modes give a buffered reader whose every read is bounded (a stalled read
        raises :class:`StoreUnavailable`)."""
        if mode != "rb":
            return self._call("open", key, self.fs.open, self.full(key), mode)
        return io.BufferedReader(self._retrying("open", key, lambda: self._open_raw(key)), buffer_size=CHUNK)

    def sign(self, key: str, expires_s: int, filename: str | None = None) -> str | None:
        """A pre-signed URL that lets anyone holding it GET ``key`` for ``expires_s`` seconds, straight from the
        store (s3fs's ``sign``; a download named ``filename``), or None where the store signs nothing (a file
        system, ``memory://``), where signing fails (say, credentials without a secret key) or with
        ``expires_s`` 0: the caller streams the file itself then. Signing is computed locally (no request to the
        store), bounded all the same."""
        if expires_s <= 0 or self.local:
            return None
        extra: dict[str, Any] = {}
        if filename and "s3" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)):
            extra = {"ResponseContentDisposition": f'attachment; filename="{filename}"',
                     "ResponseContentType": media_type(filename)}
        try:
            url = bounded(self.fs.sign, self.timeout_s, self.full(key), expiration=int(expires_s), **extra)
        except NotImplementedError:
            return None
        except Exception as exc:  # no signature: the API streams instead
            log.warning("store could not sign %r (%s); streaming it", key, type(exc).__name__)
            return None
        return url if isinstance(url, str) and url.startswith(("https://", "http://")) else None

    def size(self, key: str) -> int:
        return int(self._call("size", key, self.fs.size, self.full(key)))

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
            found = self._call("list", key, self.fs.find, base, detail=True)
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
            entries = self._call("list", key, self.fs.ls, self.full(key), detail=True)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries if e.get("type") == "directory"
                      and ".tmp-" not in e["name"])

    def local_dir(self, key: str) -> Path:
        """A local directory holding ``key``'s files: the store itself when it is a local file system, else a
        copy made once under the cache directory (safe with concurrent callers in this process and others)."""
        if self.in_place:
            path = Path(self.full(key))
            if not self._call("read", key, path.exists):
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
                        self._call("read", key, self.fs.get_file, posixpath.join(self.full(key), item["name"]),
                                   str(target), size=item["size"])
                else:
                    self._call("read", key, self.fs.get_file, self.full(key),
                               str(staging / posixpath.basename(key)), size=self.size(key))
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
            self._call("delete", key, self.fs.rm, full, recursive=True)
        except FileNotFoundError:
            pass
        self.evict(key)

    def evict(self, key: str) -> None:
        """Drop this host's cached copy of ``key``."""
        shutil.rmtree(self.cache_dir / clean_key(key), ignore_errors=True)


def _write_then_replace(tmp: str, target: str, data: bytes) -> None:
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, target)


def _lock_for(name: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(name, threading.Lock())


_STORES: dict[tuple[Any, ...], Store] = {}


def get_store(settings: Any) -> Store:
    """The store named by the settings (one instance per URL and cache directory in a process)."""
    key = (settings.store_url, str(settings.store_cache_dir), settings.store_cache_mode, settings.store_timeout_s,
           settings.store_retries)
    store = _STORES.get(key)
    if store is None:
        store = _STORES[key] = Store(settings.store_url, settings.store_cache_dir, settings.store_cache_mode,
                                     timeout_s=settings.store_timeout_s, retries=settings.store_retries)
    return store
