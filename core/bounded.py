"""The bounded parser: the API reads no user file's content in its own process.

Everything the API does with the *content* of a file a tenant brings (dataset detection and counting, safetensors
headers, the torch-free pickle shape reader, config.json and spec.json, a ``.pt2`` archive's program, LoRA labels,
test triples) runs through :func:`run_bounded`: a fresh ``python -m core.bounded`` child executes one function of
the allow-list :data:`PARSERS` (by name; the functions live in :mod:`core.parsers`) under

- an address-space limit (``RLIMIT_AS``, ``EXPLAINQ_PARSER_MEMORY_BYTES``): past it the parse fails as ``413``;
- a CPU-time limit (``RLIMIT_CPU``, ``EXPLAINQ_PARSER_CPU_S``): past it the kernel stops the child, ``422``;
- a wall-clock timeout (``EXPLAINQ_PARSER_TIMEOUT_S``): the child's process group is killed, ``422``;
- a line-length cap on every text file it streams (``EXPLAINQ_PARSER_LINE_BYTES``, :data:`core.userfiles.LINE_CAP`);
- at most ``EXPLAINQ_PARSER_CONCURRENCY`` children of one API process at once (their memory limits add up); a parse
  that finds none free within the timeout is ``503 busy`` with ``Retry-After``.

Arguments go to the child as JSON on stdin, the result comes back as JSON on stdout. A :class:`FieldError` the
child raises is raised again in the API as it was (same class, field, message); a limit is a FieldError on the
field the caller names, with the file shown relative to the data roots (never a server path); anything else the
child meets is a 422 saying the file could not be read (its details go to the log only). The API process itself
only resolves names and paths and calls ``stat``. No torch, no FastAPI.
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
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger("explainq.bounded")

# name -> "module:function" run in the child; each function takes (settings, **args) and returns JSON-able data.
PARSERS: dict[str, str] = {
    "dataset.detect": "core.parsers:detect_dataset",
    "dataset.classifier_counts": "core.parsers:classifier_counts",
    "dataset.lora_summary": "core.parsers:lora_summary",
    "dataset.news_labelled": "core.parsers:news_labelled",
    "triples.read": "core.parsers:read_test_triples",
    "import.conve_headers": "core.parsers:conve_headers",
    "import.news_pretrained": "core.parsers:news_pretrained",
    "import.hf_parameters": "core.parsers:hf_parameters",
    "import.export_nbytes": "core.parsers:export_nbytes",
    "export.kfac_problem": "core.parsers:kfac_problem",
    "model.vocab": "core.parsers:model_vocab",
    "model.class_names": "core.parsers:model_class_names",
    "model.tokenizer_has": "core.parsers:model_tokenizer_has",
}
ROOT = Path(__file__).resolve().parent.parent
_MEMORY_EXIT = 3
_STDERR_BYTES = 1 << 20
_TRANSPORTED = ("FieldError", "FieldNotFound", "FieldConflict", "FieldTooLarge", "FieldReserved")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def _limits(settings: Settings) -> dict[str, Any]:
    return {"memory_bytes": settings.parser_memory_bytes, "cpu_s": settings.parser_cpu_s,
            "line_bytes": settings.parser_line_bytes, "nice": settings.parser_nice}


def run_bounded(settings: Settings, name: str, args: dict[str, Any], *, loc: tuple, value: Any = None,
                shown: str = "the file") -> Any:
    """The result of parser ``name`` on ``args``, computed in a bounded child process.

    ``loc``, ``value`` and ``shown`` (the file as messages name it, relative to the data roots) make the FieldError
    raised when the child runs past a limit or fails unexpectedly."""
    from core.contract import errors

    if name not in PARSERS:
        raise KeyError(f"{name!r} is not a bounded parser")
    payload = json.dumps({"name": name, "args": args, "limits": _limits(settings),
                          "data_roots": [str(r) for r in settings.data_roots],
                          "settings": settings.model_dump(mode="json", exclude={"api_keys_raw"})}).encode()
    slots = _slots(settings.parser_concurrency)
    if not slots.acquire(timeout=settings.parser_timeout_s):
        raise errors.FieldBusy(loc, f"{shown}: every file reader of this server is busy "
                               f"({settings.parser_concurrency} at once, EXPLAINQ_PARSER_CONCURRENCY); retry later",
                               value=value, retry_after_s=5)
    try:
        return _run(settings, name, payload, loc=loc, value=value, shown=shown)
    finally:
        slots.release()


_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def _slots(n: int) -> threading.BoundedSemaphore:
    """The semaphore that keeps at most ``n`` children of this process alive at once (their memory limits add up)."""
    with _SLOTS_LOCK:
        if n not in _SLOTS:
            _SLOTS[n] = threading.BoundedSemaphore(n)
        return _SLOTS[n]


def _run(settings: Settings, name: str, payload: bytes, *, loc: tuple, value: Any, shown: str) -> Any:
    from core.contract import errors

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}
    # the child's messages go to a file it may grow to _STDERR_BYTES (RLIMIT_FSIZE), never into this process's memory
    err_file = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "core.bounded"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err_file, env=env, cwd=str(ROOT), close_fds=True, start_new_session=True)
    try:
        out, _ = proc.communicate(payload, timeout=settings.parser_timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise errors.FieldError(loc, f"{shown}: reading it took longer than {settings.parser_timeout_s:g} s "
                                "(EXPLAINQ_PARSER_TIMEOUT_S)", value=value) from None
    except BaseException:
        _kill(proc)
        raise
    finally:
        err_file.seek(0)
        err = err_file.read(_STDERR_BYTES)
        err_file.close()
    rc = proc.returncode
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):
        raise errors.FieldError(loc, f"{shown}: reading it needed more than {settings.parser_cpu_s} s of CPU time "
                                "(EXPLAINQ_PARSER_CPU_S)", value=value)
    if rc == _MEMORY_EXIT or rc in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS):
        raise errors.FieldTooLarge(loc, f"{shown}: reading it needed more than {_gib(settings.parser_memory_bytes)} "
                                   "of memory (EXPLAINQ_PARSER_MEMORY_BYTES)", value=value)
    try:
        answer = json.loads(out) if rc == 0 else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        log.warning("bounded parser %s failed (exit %s): %s", name, rc, err[-2000:].decode(errors="replace"))
        raise errors.FieldError(loc, f"{shown} could not be read", value=value)
    if "ok" in answer:
        return answer["ok"]
    if "field_error" in answer:
        fe = answer["field_error"]
        cls = getattr(errors, fe["class"]) if fe.get("class") in _TRANSPORTED else errors.FieldError
        exc = cls(fe["loc"], fe["message"], value=fe.get("value"),
                  related=[(tuple(r[0]), r[1]) for r in fe.get("related") or []])
        raise exc
    log.warning("bounded parser %s failed: %s", name, answer.get("error"))
    raise errors.FieldError(loc, f"{shown} could not be read", value=value)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.communicate()


# ------------------------------------------------------------------------------------------ the child
class _ChildSettings:
    """The API's settings in the child: ``data_roots`` at once (all the user-file readers need), the rest built on
    first use (pydantic's import costs about a third of a second; most parsers never need it)."""

    def __init__(self, fields: dict[str, Any], data_roots: list[str]):
        self._fields = fields
        self.data_roots = [Path(r) for r in data_roots]
        self._settings = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._settings is None:
            from core.settings import Settings

            self._settings = Settings(**self._fields)
        return getattr(self._settings, name)


def _child() -> int:
    request = json.loads(sys.stdin.buffer.read())
    limits = request["limits"]
    memory = int(limits["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_STDERR_BYTES, _STDERR_BYTES))  # it writes no file but its messages
    os.nice(int(limits.get("nice", 0)))  # below the API's own requests when the CPUs are contended
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # whatever a library prints goes with the messages; the answer alone goes to the API
    name = request["name"]
    try:
        if name not in PARSERS:
            raise KeyError(f"{name!r} is not a bounded parser")
        import importlib

        from core import userfiles
        from core.contract.errors import FieldError

        userfiles.LINE_CAP = int(limits["line_bytes"])
        settings = _ChildSettings(request["settings"], request["data_roots"])
        module, func = PARSERS[name].split(":")
        try:
            result = getattr(importlib.import_module(module), func)(settings, **request["args"])
            answer: dict[str, Any] = {"ok": result}
        except FieldError as exc:
            answer = {"field_error": {"class": type(exc).__name__, "loc": list(exc.loc), "message": exc.message,
                                      "value": exc.value, "related": [[list(r), v] for r, v in exc.related]}}
        text = json.dumps(answer, default=str)
    except MemoryError:
        return _MEMORY_EXIT
    except Exception as exc:  # noqa: BLE001 - reported to the API, which answers 422 and logs it
        try:
            text = json.dumps({"error": f"{type(exc).__name__}: {exc}"[:4000]})
        except MemoryError:
            return _MEMORY_EXIT
    with os.fdopen(answer_fd, "w") as answer_out:
        answer_out.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(_child())
