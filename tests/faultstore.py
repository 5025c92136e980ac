"""A store that can stop answering, for tests: ``faultfs://<dir>`` is a local directory seen through fsspec as an
object store would be (not a file system: hosts copy what they read), whose every call first looks at a control
file named by ``$FAULTFS_CONTROL``:

- ``ok`` (or no file): the call goes through;
- ``hang``: the call waits until the file says something else (a paused server);
- ``refuse``: the call raises ``ConnectionRefusedError`` (a server that is down).

A file opened for reading looks again at every read, so a download can stall half way. Processes load it with
``EXPLAINQ_KIND_PLUGINS=...,tests.faultstore:register`` (the workers) or by calling :func:`register`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.utils import stringify_path

PROTOCOL = "faultfs"
CONTROL = "FAULTFS_CONTROL"
CALLS = {"n": 0}  # calls that reached the fault check in this process


def mode() -> str:
    path = os.environ.get(CONTROL)
    try:
        return Path(path).read_text().strip() if path else "ok"
    except FileNotFoundError:
        return "ok"


def set_mode(control: Path, value: str) -> None:
    tmp = control.with_name(control.name + ".tmp")
    tmp.write_text(value)
    os.replace(tmp, control)


def fault() -> None:
    CALLS["n"] += 1
    while True:
        now = mode()
        if now == "hang":
            time.sleep(0.02)
            continue
        if now == "refuse":
            raise ConnectionRefusedError(111, "Connection refused")
        return


class _FaultyFile:
    def __init__(self, fh: Any):
        self.fh = fh

    def read(self, *args: Any) -> bytes:
        fault()
        return self.fh.read(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fh, name)

    def __enter__(self) -> _FaultyFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.fh.close()


class FaultFS(LocalFileSystem):
    protocol = (PROTOCOL,)
    root_marker = "/"

    def __init__(self, **kwargs: Any):
        super().__init__(auto_mkdir=True, **kwargs)  # like an object store: a key needs no parent directory

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        path = stringify_path(path)
        if path.startswith(PROTOCOL + "://"):
            path = path[len(PROTOCOL) + 3:]
        return super()._strip_protocol(path)

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        fault()
        fh = super()._open(path, mode, *args, **kwargs)
        return _FaultyFile(fh) if "r" in mode else fh


def _faulty(name: str) -> Any:
    original = getattr(LocalFileSystem, name)

    def call(self: FaultFS, *args: Any, **kwargs: Any) -> Any:
        fault()
        return original(self, *args, **kwargs)

    call.__name__ = name
    return call


for _name in ("info", "ls", "exists", "isdir", "find", "cat_file", "pipe_file", "put_file", "get_file",
              "makedirs", "rm", "size", "mv"):
    setattr(FaultFS, _name, _faulty(_name))


def register() -> None:
    fsspec.register_implementation(PROTOCOL, FaultFS, clobber=True)
