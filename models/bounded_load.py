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

Why a child rather than checking the pickle first with the torch-free shape reader and then loading it in the
worker: the shape reader refuses what it does not know and leaves it to the load (``pickle_shapes`` returns None),
so a file it gives up on would still be unpickled unbounded; and a check followed by a second read is two readings
of a file its owner may change in between. The child runs the very loader that decides, once.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import subprocess
import sys
import tempfile
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
# op -> "module:function" the child runs (named, not imported here: those modules call this one)
LOADERS = {"state": "models.weight_files:load_state_here", "maps": "models.kg.importer:checkpoint_maps_here"}


@dataclass(frozen=True)
class LoadBounds:
    memory_bytes: int = 1 << 30
    cpu_s: int = 300
    timeout_s: float = 600.0

    @classmethod
    def of(cls, settings: Any) -> LoadBounds:
        """The service's ``EXPLAINQ_WORKER_LOAD_*`` settings (the defaults above are theirs, for library use)."""
        return cls(settings.worker_load_memory_bytes, settings.worker_load_cpu_s, settings.worker_load_timeout_s)


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
    request = {**request, "memory_bytes": bounds.memory_bytes + size, "cpu_s": bounds.cpu_s}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    err_file = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "models.bounded_load"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err_file, env=env, cwd=str(ROOT), close_fds=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(json.dumps(request).encode(), timeout=bounds.timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise LoadRefused("invalid_model", f"{shown}: loading it took longer than {bounds.timeout_s:g} s "
                          "(EXPLAINQ_WORKER_LOAD_TIMEOUT_S)") from None
    except BaseException:
        _kill(proc)
        raise
    finally:
        err_file.seek(0)
        err = err_file.read(_STDERR_BYTES)
        err_file.close()
    rc = proc.returncode
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):
        raise LoadRefused("invalid_model", f"{shown}: loading it needed more than {bounds.cpu_s} s of CPU time "
                          "(EXPLAINQ_WORKER_LOAD_CPU_S)")
    if rc == _MEMORY_EXIT or rc in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS):
        raise LoadRefused("too_large", f"{shown}: loading it needed more than {_mib(bounds.memory_bytes)} of memory "
                          "beyond the file's own size (EXPLAINQ_WORKER_LOAD_MEMORY_BYTES)")
    try:
        answer = json.loads(out) if rc == 0 else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "ok" in answer:
        return answer["ok"]
    if isinstance(answer, dict) and "value_error" in answer:
        raise ValueError(answer["value_error"])
    log.warning("bounded load of %s failed (exit %s): %s", shown, rc, err[-2000:].decode(errors="replace"))
    raise LoadRefused("invalid_model", f"{shown} could not be loaded")


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.communicate()


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


def _child() -> int:
    request = json.loads(sys.stdin.buffer.read())
    cpu = int(request["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # whatever a library prints goes with the messages; the answer alone goes to the worker
    import importlib

    import torch  # mapped before the limit is taken, so the limit is what the load itself may add

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
    with os.fdopen(answer_fd, "w") as answer_out:
        answer_out.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(_child())
