"""Weight files brought from elsewhere: reading a state dict safely and checking it against a model.

``load_state_file`` reads ``.safetensors`` or a PyTorch pickle (``.pt``, ``.pth``, ``.bin``, ``.ckpt``) with
``torch.load(weights_only=True)`` only, in a bounded child process (:mod:`models.bounded_load`; the loader itself is
``load_state_here``): a file that needs arbitrary code to unpickle is refused, never run. A pickle
holding ``{"state_dict": ...}`` or ``{"model_state_dict": ...}`` (common training-script layouts) is unwrapped.

``check_state`` compares every tensor's name and shape with the model built from the config, before anything is
loaded or registered; :class:`StateMismatch` lists the offending tensors. ``shape_problems`` is the same check on
plain shapes (the API runs it on a safetensors header, or on ``pickle_shapes`` of a ``.pt`` file: both without torch).
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from models.files import LOCAL, FileAccess

if TYPE_CHECKING:  # this module is imported by the API, which never imports torch
    import torch

    from models.bounded_load import LoadBounds

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")


# Hard limits of the torch-free shape reader: a state dict's object graph is small (a few hundred bytes and a few
# dozen pickle operations per tensor), so anything past these is refused, never built.
MAX_PICKLE_BYTES = 16 << 20       # data.pkl inside the archive
MAX_PICKLE_OPS = 2_000_000        # pickle operations executed
MAX_PICKLE_MEMO = 500_000         # memoised objects
MAX_PICKLE_STACK = 500_000        # items on the unpickler's stacks
MAX_TENSORS = 100_000
MAX_TENSOR_DIMS = 8
MAX_DECLARED_ELEMENTS = 10**12    # elements over all tensors (about 4 TB of fp32)
MAX_ZIP_ENTRIES = 200_000


class _Shape(tuple):
    """A tensor's shape standing in for the tensor (what ``pickle_shapes`` rebuilds)."""


class PickleLimit(pickle.UnpicklingError):
    """The pickle exceeds one of the shape reader's limits."""


def _counted(op):  # noqa: ANN001, ANN202 - wraps one opcode of pickle's pure-Python unpickler
    def run(self: _ShapeUnpickler) -> None:
        self._ops += 1
        if self._ops > MAX_PICKLE_OPS:
            raise PickleLimit(f"more than {MAX_PICKLE_OPS} pickle operations")
        op(self)
        if len(self.memo) > MAX_PICKLE_MEMO:
            raise PickleLimit(f"more than {MAX_PICKLE_MEMO} memoised objects")
        if len(self.stack) + len(self.metastack) > MAX_PICKLE_STACK:
            raise PickleLimit(f"more than {MAX_PICKLE_STACK} objects on the stack")
    return run


class _ShapeUnpickler(pickle._Unpickler):  # type: ignore[name-defined]  # the Python one: its opcodes can be counted
    """Unpickles a torch zip-format state dict into ``{name: _Shape}`` without torch: only the callables a state
    dict needs are allowed, each replaced by one that returns a shape; anything else is refused. Fails closed on any
    limit above (operations, memo, stack, tensors, dimensions, declared elements)."""

    dispatch = {code: _counted(op) for code, op in pickle._Unpickler.dispatch.items()}  # type: ignore[attr-defined]

    def __init__(self, file):  # noqa: ANN001
        super().__init__(file)
        self._ops = 0
        self._tensors = 0
        self._elements = 0

    def _rebuild(self, storage, offset, size, stride, *rest):  # noqa: ANN001, ANN202
        if not isinstance(size, tuple | list) or len(size) > MAX_TENSOR_DIMS or \
                not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**48 for d in size):
            raise PickleLimit(f"a tensor size is not a list of at most {MAX_TENSOR_DIMS} non-negative integers")
        self._tensors += 1
        if self._tensors > MAX_TENSORS:
            raise PickleLimit(f"more than {MAX_TENSORS} tensors")
        n = 1
        for d in size:
            n *= d
        self._elements += n
        if self._elements > MAX_DECLARED_ELEMENTS:
            raise PickleLimit(f"more than {MAX_DECLARED_ELEMENTS} elements declared")
        return _Shape(size)

    def find_class(self, module: str, name: str):  # noqa: ANN201 - pickle protocol
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self._rebuild
        if module == "torch._utils" and name == "_rebuild_parameter":
            return lambda data, *rest: data
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return name
        if module == "torch" and name in ("float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8",
                                          "int8", "bool"):
            return name
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain state dict")

    def persistent_load(self, pid):  # noqa: ANN001, ANN201 - storages are not read, only shapes
        return None


def _data_pkl(zf: zipfile.ZipFile) -> bytes | None:
    infos = zf.infolist()
    if len(infos) > MAX_ZIP_ENTRIES:
        raise PickleLimit(f"more than {MAX_ZIP_ENTRIES} archive entries")
    info = next((i for i in infos if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"), None)
    if info is None:
        return None
    if info.file_size > MAX_PICKLE_BYTES:
        raise PickleLimit(f"data.pkl is {info.file_size} bytes; at most {MAX_PICKLE_BYTES}")
    # zipfile never returns more than the entry's declared size (a member that inflates past it fails its CRC
    # check), and that size was bounded above: a zip bomb stops here
    with zf.open(info) as member:
        return member.read(MAX_PICKLE_BYTES)


def pickle_shapes(path: str | Path, files: FileAccess = LOCAL) -> dict[str, tuple[int, ...]] | None:
    """Tensor names and shapes of a torch zip-format pickle (``torch.save``), read without torch and without running
    anything in the file; None when the file is not a plain (possibly wrapped) state dict in that format or exceeds
    the reader's limits (then the worker's ``weights_only`` load decides, with its own bounds)."""
    try:
        with files.open(Path(path), "pickle") as fh, zipfile.ZipFile(fh) as zf:
            raw = _data_pkl(zf)
            if raw is None:
                return None
            obj = _ShapeUnpickler(io.BytesIO(raw)).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, OSError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, RecursionError, zipfile.LargeZipFile, NotImplementedError):
        return None
    for key in WRAPPER_KEYS:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict):
        return None
    out = {k: tuple(v) for k, v in obj.items() if isinstance(k, str) and isinstance(v, _Shape)}
    return out or None


class StateMismatch(ValueError):
    """A state dict whose tensor names or shapes do not fit the config; ``problems`` names the tensors."""

    def __init__(self, source: str, problems: list[str]):
        shown = "; ".join(problems[:12]) + (f"; and {len(problems) - 12} more" if len(problems) > 12 else "")
        super().__init__(f"{source}: {shown}")
        self.problems = problems


def pickle_modules(path: str | Path, files: FileAccess = LOCAL) -> set[str]:
    """The modules a torch zip-format pickle's globals come from, read with ``pickletools`` (nothing is built or run;
    empty when the file is not in that format or is past the reader's limits)."""
    import pickletools

    try:
        with files.open(Path(path), "pickle") as fh, zipfile.ZipFile(fh) as zf:
            raw = _data_pkl(zf)
        if raw is None:
            return set()
        modules: set[str] = set()
        strings: list[str] = []
        for n, (op, arg, _) in enumerate(pickletools.genops(raw)):
            if n > MAX_PICKLE_OPS:
                break
            if op.name == "GLOBAL":
                modules.add(str(arg).split(" ")[0])
            elif isinstance(arg, str):
                strings.append(arg)
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                modules.add(strings[-2])
        return modules
    except (zipfile.BadZipFile, OSError, ValueError, PickleLimit, zipfile.LargeZipFile, NotImplementedError):
        return set()


def pykeen_model_pickle(path: str | Path, files: FileAccess = LOCAL) -> bool:
    """Whether the file is a pickled PyKEEN model (``torch.save(model)``), which only runs with PyKEEN's code."""
    return any(m == "pykeen" or m.startswith("pykeen.") for m in pickle_modules(path, files))


PYKEEN_MODEL_PICKLE = ("{name} is a pickled PyKEEN model (torch.save(model)): loading it would run PyKEEN's code, "
                       "which is never done here. Export its weights instead, in PyKEEN: "
                       'torch.save(model.state_dict(), "model.pt")')

_STORAGE_DTYPES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
                   "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
                   "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool"}


class _Opaque:
    """Stands in for a numpy object of a checkpoint (a random state): never built, never used."""

    def __init__(self, *args: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        pass


class _CheckpointUnpickler(pickle.Unpickler):
    """A training-loop checkpoint (``torch.save`` of a dict of state dicts, numbers, lists, random states) that
    ``weights_only`` cannot read (PyKEEN's: pickle protocol 5, numpy random state). Allow-listed: tensors and their
    storages, ``OrderedDict``, and numpy's array/dtype reconstructors, which become inert placeholders. Any other
    global is refused, so nothing in the file runs."""

    def __init__(self, file, zf: zipfile.ZipFile, prefix: str):  # noqa: ANN001
        super().__init__(file)
        self._zf = zf
        self._prefix = prefix
        self._elements = 0

    def find_class(self, module: str, name: str):  # noqa: ANN201 - pickle protocol
        import torch

        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return torch._utils._rebuild_tensor_v2
        if module == "torch._utils" and name == "_rebuild_parameter":
            return lambda data, *rest: data
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return getattr(torch, _STORAGE_DTYPES[name])
        if module in ("numpy", "numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric",
                      "numpy._core.numeric") and name in ("dtype", "ndarray", "_reconstruct", "_frombuffer"):
            return _Opaque
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a training checkpoint")

    def persistent_load(self, pid):  # noqa: ANN001, ANN201 - ("storage", dtype, key, location, numel)
        import torch

        if not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage" or not isinstance(pid[1], torch.dtype):
            raise pickle.UnpicklingError("unexpected persistent id")
        _, dtype, key, _, numel = pid
        if not isinstance(key, str) or not key.isdigit() or not isinstance(numel, int) or numel < 0:
            raise pickle.UnpicklingError("unexpected storage record")
        self._elements += numel
        if self._elements > MAX_DECLARED_ELEMENTS:
            raise PickleLimit(f"more than {MAX_DECLARED_ELEMENTS} elements declared")
        info = self._zf.getinfo(f"{self._prefix}data/{key}")
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if info.file_size != nbytes:
            raise pickle.UnpicklingError(f"storage {key} holds {info.file_size} bytes, {nbytes} declared")
        raw = bytearray(self._zf.read(info))
        untyped = torch.frombuffer(raw, dtype=torch.uint8).untyped_storage() if raw else torch.UntypedStorage(0)
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def load_checkpoint_pickle(path: str | Path) -> dict:
    """A torch zip-format checkpoint read with :class:`_CheckpointUnpickler` (never ``weights_only=False``)."""
    path = Path(path)
    with zipfile.ZipFile(path) as zf:
        raw = _data_pkl(zf)
        if raw is None:
            raise pickle.UnpicklingError("not a torch zip-format file")
        prefix = next(i.filename for i in zf.infolist() if i.filename.endswith("data.pkl"))[:-len("data.pkl")]
        order = zf.read(f"{prefix}byteorder").decode().strip() if f"{prefix}byteorder" in zf.namelist() else "little"
        if order != "little":
            raise pickle.UnpicklingError(f"byte order {order!r}")
        obj = _CheckpointUnpickler(io.BytesIO(raw), zf, prefix).load()
    if not isinstance(obj, dict):
        raise pickle.UnpicklingError("not a dict")
    return obj


def load_state_file(path: str | Path, pykeen: bool = False, bounds: LoadBounds | None = None,
                    shown: str | None = None) -> dict[str, torch.Tensor]:
    """:func:`load_state_here` run in a bounded child process (:mod:`models.bounded_load`): the file is a tenant's,
    and unpickling it may take any amount of memory and time. ``shown``: the file as messages name it."""
    from models.bounded_load import load_state

    if Path(path).suffix not in PICKLE_SUFFIXES:  # safetensors (a JSON header and raw bytes), or refused at once
        return load_state_here(path, pykeen)
    return load_state(path, pykeen, bounds, shown)


def load_state_here(path: str | Path, pykeen: bool = False) -> dict[str, torch.Tensor]:
    """A flat ``{name: tensor}`` from a safetensors file or a weights-only PyTorch pickle, or from a training-loop
    checkpoint's ``model_state_dict`` (PyKEEN's: read by :func:`load_checkpoint_pickle`). ``pykeen``: the file is
    expected to be PyKEEN's, and messages say so."""
    import torch

    path = Path(path)
    whose = "PyKEEN " if pykeen else ""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path), device="cpu")
    if path.suffix not in PICKLE_SUFFIXES:
        raise ValueError(f"{path.name}: expected .safetensors or one of {', '.join(PICKLE_SUFFIXES)}")
    if pykeen_model_pickle(path):
        raise ValueError(PYKEEN_MODEL_PICKLE.format(name=path.name))
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as exc:  # the unpickler refuses anything but tensors and plain containers
        if "MemoryError" in str(exc):  # the weights-only unpickler wraps it
            raise MemoryError(str(exc)[:300]) from None
        try:
            obj = load_checkpoint_pickle(path)
        except MemoryError:
            raise
        except Exception:  # noqa: BLE001 - any failure is the same refusal
            raise ValueError(f"{path.name} cannot be read with weights_only=True (only tensors and plain containers "
                             f"are accepted), nor as a {whose}training checkpoint: "
                             f"{str(exc).splitlines()[0][:300]}") from None
        if not isinstance(obj.get("model_state_dict"), dict):
            raise ValueError(f"{path.name} cannot be read with weights_only=True and is not a {whose}training "
                             "checkpoint (no model_state_dict)") from None
    for key in WRAPPER_KEYS:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict) and not isinstance(obj.get(key), torch.Tensor):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path.name} does not hold a {whose}state dict (a mapping of names to tensors)")
    return {str(k): v for k, v in obj.items()}


def strip_prefix(state: Mapping[str, torch.Tensor], prefixes: Iterable[str] = ("module.", "_orig_mod.")
                 ) -> dict[str, torch.Tensor]:
    """Drop the wrappers' name prefixes (DataParallel's ``module.``, torch.compile's ``_orig_mod.``)."""
    out = {}
    for k, v in state.items():
        for p in prefixes:
            if k.startswith(p):
                k = k[len(p):]
        out[k] = v
    return out


def shape_problems(expected: Mapping[str, tuple[int, ...]], given: Mapping[str, tuple[int, ...]],
                   optional: Iterable[str] = ()) -> list[str]:
    """Every missing, unexpected or mis-shaped tensor, by name (``optional`` name prefixes may be missing)."""
    optional = tuple(optional)
    problems = []
    for name, shape in expected.items():
        if name not in given:
            if not name.startswith(optional) and not name.endswith("num_batches_tracked"):
                problems.append(f"missing tensor {name} {list(shape)}")
        elif tuple(given[name]) != tuple(shape):
            problems.append(f"tensor {name} has shape {list(given[name])}, the config needs {list(shape)}")
    problems += [f"unexpected tensor {name} {list(given[name])}" for name in given if name not in expected]
    return problems


def state_problems(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor],
                   optional: Iterable[str] = ()) -> list[str]:
    return shape_problems({k: tuple(v.shape) for k, v in expected.items()},
                          {k: tuple(v.shape) for k, v in given.items()}, optional)


def check_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str,
                optional: Iterable[str] = ()) -> None:
    problems = state_problems(model.state_dict(), state, optional)
    if problems:
        raise StateMismatch(source, problems)
