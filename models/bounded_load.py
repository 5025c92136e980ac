"""The bounded checkpoint load: a worker unpickles no tenant's file in its own process.

A pickle a tenant brings (an imported model's ``.pt`` / ``.pth`` / ``.bin`` / ``.ckpt`` weights and checkpoints) is
read by :func:`models.weight_files.load_state_here` in a fresh ``python -m models.bounded_load`` child under

- an address-space limit (``RLIMIT_AS``): what the child has mapped once torch is imported, plus the file's own size
  (its tensors), plus ``EXPLAINQ_WORKER_LOAD_MEMORY_BYTES``; past it the job fails ``too_large``;
- a CPU-time limit (``RLIMIT_CPU``, ``EXPLAINQ_WORKER_LOAD_CPU_S``) and a wall-clock timeout
  (``EXPLAINQ_WORKER_LOAD_TIMEOUT_S``, the child's process group is killed): past either the job fails
  ``invalid_model``.

The child writes the flat ``{name: tensor}`` it read with ``torch.save`` into a private temporary directory and the
worker reads that back with ``torch.load(weights_only=True)``: a pickle the service wrote itself from a flat dict of
strings and tensors, so nothing of the tenant's pickle program runs in the worker. The worker waits with the GIL
released, so its heartbeat thread keeps the job alive however long the load takes (an in-process C unpickler held
the GIL for the whole of a load). Messages name the file as the job's caller gave it (relative to the data roots),
never a server path.

The children are forked by a warm child (a zygote): ``python -m models.bounded_load --serve``, started once per
worker process on its first load with torch and the loaders imported, kept while the worker lives
(``EXPLAINQ_WORKER_LOAD_WARM``; off starts one per load). For each load it forks a fresh child that leaves the
zygote's session and pipes (stdin from ``/dev/null``, stdout and stderr to a file of the load's own), takes the
limits above and runs the loader once; the zygote reports the child's pid and then its exit status, and the
worker kills the child's process group past the wall-clock timeout. The zygote never reads a tenant's file itself,
so nothing of one load reaches another; what a load costs beyond the loader is a ``fork`` (milliseconds), not
starting Python and importing torch (seconds: ``benchmarks/bounded_load.py``).

Why a child rather than checking the pickle first with the torch-free shape reader and then loading it in the
worker: the shape reader refuses what it does not know and leaves it to the load (``pickle_shapes`` returns None),
so a file it gives up on would still be unpickled unbounded; and a check followed by a second read is two readings
of a file its owner may change in between. The child runs the very loader that decides, once.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger("explainq.bounded_load")

ROOT = Path(__file__).resolve().parent.parent
_MEMORY_EXIT = 3
_STDERR_BYTES = 1 << 20
STATE_FILE = "state.pt"
ANSWER_FILE = "answer.json"
ERR_FILE = "stderr.txt"
ZYGOTE_START_S = 300.0  # starting the warm child (torch's import on a loaded host) and a fork's acknowledgement
# op -> "module:function" the child runs (named, not imported here: those modules call this one)
LOADERS = {"state": "models.weight_files:load_state_here", "maps": "models.kg.importer:checkpoint_maps_here"}


@dataclass(frozen=True)
class LoadBounds:
    memory_bytes: int = 1 << 30
    cpu_s: int = 300
    timeout_s: float = 600.0
    warm: bool = True

    @classmethod
    def of(cls, settings: Any) -> LoadBounds:
        """The service's ``EXPLAINQ_WORKER_LOAD_*`` settings (the defaults above are theirs, for library use)."""
        return cls(settings.worker_load_memory_bytes, settings.worker_load_cpu_s, settings.worker_load_timeout_s,
                   settings.worker_load_warm)


class LoadRefused(ValueError):
    """A load past one of the bounds (``code`` ``too_large``) or that the child could not finish (``invalid_model``)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def _mib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def load_state(path: str | Path, pykeen: bool = False, bounds: LoadBounds | None = None,
               shown: str | None = None) -> dict[str, torch.Tensor]:
    """:func:`models.weight_files.load_state_here` of ``path``, run in the bounded child. A ValueError the loader
    raises (the file is not a state dict...) is raised again here; a bound is a :class:`LoadRefused`."""
    import torch

    with tempfile.TemporaryDirectory(prefix="explainq-load-") as tmp:
        _run({"op": "state", "path": str(path), "pykeen": pykeen, "out": tmp}, bounds, shown or Path(path).name)
        return torch.load(str(Path(tmp) / STATE_FILE), map_location="cpu", weights_only=True)


def checkpoint_maps(path: str | Path, bounds: LoadBounds | None = None, shown: str | None = None
                    ) -> dict[str, dict[str, int]]:
    """:func:`models.kg.importer.checkpoint_maps_here` of ``path``, run in the bounded child."""
    return _run({"op": "maps", "path": str(path)}, bounds, shown or Path(path).name)


def _run(request: dict[str, Any], bounds: LoadBounds | None, shown: str) -> Any:
    bounds = bounds or LoadBounds()
    try:
        size = os.stat(request["path"]).st_size
    except OSError as exc:
        raise ValueError(f"{shown}: {exc.strerror or 'cannot be read'}") from None
    with tempfile.TemporaryDirectory(prefix="explainq-answer-") as box:
        request = {**request, "memory_bytes": bounds.memory_bytes + size, "cpu_s": bounds.cpu_s, "box": box}
        if bounds.warm:
            with _ZYGOTE_LOCK:
                rc = _zygote().load(request, bounds, shown)
        else:
            zygote = _Zygote()
            try:
                rc = zygote.load(request, bounds, shown)
            finally:
                zygote.close()
        err = _read_capped(Path(box) / ERR_FILE, _STDERR_BYTES)
        try:
            answer = json.loads((Path(box) / ANSWER_FILE).read_text()) if rc == 0 else None
        except (OSError, ValueError):
            answer = None
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):
        raise LoadRefused("invalid_model", f"{shown}: loading it needed more than {bounds.cpu_s} s of CPU time "
                          "(EXPLAINQ_WORKER_LOAD_CPU_S)")
    if rc == _MEMORY_EXIT or rc in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS):
        raise LoadRefused("too_large", f"{shown}: loading it needed more than {_mib(bounds.memory_bytes)} of memory "
                          "beyond the file's own size (EXPLAINQ_WORKER_LOAD_MEMORY_BYTES)")
    if isinstance(answer, dict) and "ok" in answer:
        return answer["ok"]
    if isinstance(answer, dict) and "value_error" in answer:
        raise ValueError(answer["value_error"])
    log.warning("bounded load of %s failed (exit %s): %s", shown, rc, err[-2000:].decode(errors="replace"))
    raise LoadRefused("invalid_model", f"{shown} could not be loaded")


def _read_capped(path: Path, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


class _Zygote:
    """The warm child: one ``python -m models.bounded_load --serve`` with torch imported, forking a bounded child
    per load. One load at a time (the caller holds :data:`_ZYGOTE_LOCK` for a shared one)."""

    def __init__(self) -> None:
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2",
               "CUDA_VISIBLE_DEVICES": ""}
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "models.bounded_load", "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._err, env=env, cwd=str(ROOT),
                                     close_fds=True, start_new_session=True)
        self._buf = b""
        try:
            ready = self._line(time.monotonic() + ZYGOTE_START_S)
        except BaseException:
            self.close()
            raise
        if ready != {"ready": True}:
            self.close()
            raise RuntimeError(f"the bounded load's child did not start: {self._stderr()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def load(self, request: dict[str, Any], bounds: LoadBounds, shown: str) -> int:
        """Run one load in a fresh bounded child; its exit status as ``Popen.returncode`` gives it (negative: the
        signal). Past ``bounds.timeout_s`` the child's process group is killed and :class:`LoadRefused` raised."""
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            started = self._line(time.monotonic() + ZYGOTE_START_S)
            pid = int(started["pid"])
        except BaseException:
            self.close()
            raise
        try:
            return int(self._line(time.monotonic() + bounds.timeout_s)["status"])
        except TimeoutError:
            _killpg(pid)
            try:
                self._line(time.monotonic() + ZYGOTE_START_S)  # the zygote reaps it and says so
            except BaseException:
                self.close()
            raise LoadRefused("invalid_model", f"{shown}: loading it took longer than {bounds.timeout_s:g} s "
                              "(EXPLAINQ_WORKER_LOAD_TIMEOUT_S)") from None
        except BaseException:
            _killpg(pid)
            self.close()
            raise

    def _line(self, deadline: float) -> dict[str, Any]:
        """The zygote's next answer line, waiting (the GIL released) until ``deadline``."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the bounded load's child exited: {self._stderr()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _stderr(self) -> str:
        self._err.seek(0)
        return self._err.read(_STDERR_BYTES)[-2000:].decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            _killpg(self.proc.pid)
        try:
            self.proc.communicate(timeout=10)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            pass
        self._err.close()


_ZYGOTE_LOCK = threading.Lock()
_SHARED: list[_Zygote] = []


def _zygote() -> _Zygote:
    """The process's warm child, started (again) when there is none or it has died."""
    if _SHARED and _SHARED[0].alive():
        return _SHARED[0]
    if _SHARED:
        _SHARED.pop().close()
    _SHARED.append(_Zygote())
    return _SHARED[0]


@atexit.register
def stop_warm_child() -> None:
    """End the warm child (it also ends by itself when its parent's pipe closes)."""
    with _ZYGOTE_LOCK:
        while _SHARED:
            _SHARED.pop().close()


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


# ------------------------------------------------------------------------------------------ the child
def _out_of_memory(exc: BaseException) -> bool:
    """A MemoryError, or torch's wrapping of one (the weights-only unpickler re-raises it as UnpicklingError, the
    allocator as RuntimeError), anywhere in the chain."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, MemoryError) or "MemoryError" in str(exc) or "can't allocate memory" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def _serve() -> int:
    """The zygote: torch and the loaders imported once, then a forked child per request line on stdin."""
    import importlib

    import torch  # noqa: F401 - mapped before any child takes its limit, so the limit is what a load may add

    for target in LOADERS.values():
        importlib.import_module(target.split(":")[0])
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # whatever a library prints goes to the log; answers alone go to the worker
    out.write(b'{"ready": true}\n')
    for line in sys.stdin.buffer:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.close(out.fileno())  # the answer pipe stays the zygote's alone
            try:
                code = _child(request)
            except BaseException:  # noqa: BLE001 - the child must never return into the zygote's loop
                code = 1
            os._exit(code)
        out.write(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
    return 0


def _child(request: dict[str, Any]) -> int:
    os.setsid()  # its own process group, which the worker kills past the timeout
    box = Path(request["box"])
    log_fd = os.open(box / ERR_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)  # the zygote's pipes are closed to it: it can neither read requests nor forge answers
    os.close(null)
    os.close(log_fd)
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.stdout = sys.stderr = open(1, "w", closefd=False)  # noqa: SIM115
    cpu = int(request["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import importlib

    import torch

    module, func = LOADERS[request["op"]].split(":")
    loader = getattr(importlib.import_module(module), func)
    memory = _vm_size() + int(request["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        if request["op"] == "state":
            torch.save(loader(request["path"], bool(request["pykeen"])), str(Path(request["out"]) / STATE_FILE))
            answer: dict[str, Any] = {"ok": True}
        else:
            answer = {"ok": loader(Path(request["path"]))}
        text = json.dumps(answer)
    except BaseException as exc:  # noqa: BLE001 - reported to the worker
        if _out_of_memory(exc):
            return _MEMORY_EXIT
        if isinstance(exc, ValueError):
            text = json.dumps({"value_error": str(exc)[:4000]})
        else:
            text = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:4000]})
            print(text, file=sys.stderr)
    (box / ANSWER_FILE).write_text(text)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
