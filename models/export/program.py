"""Run an exported classifier with the service's own interpreter: no code from the file, no pickle, no eval.

The archive is first checked as data (:func:`models.export.files.inspect_program`), then:

- each weight and constant is built from its raw bytes (``torch.frombuffer`` and the recorded sizes, strides and
  offset) and frozen;
- :class:`Program` walks the checked nodes in order, calling each one's ATen operator (looked up by its checked
  name in ``torch.ops.aten``, or a Python size operator) on arguments rebuilt from their serialized kinds: tensors
  by name, numbers, lists, dtypes, devices (always the model's device), sizes. Nothing else is resolved: the
  archive's ``sample_inputs`` pickle, ``guards_code`` and symbolic expressions are never read;
- :func:`dry_run` runs the program once on the ``meta`` device (shapes only, no memory) with a batch of one and
  refuses a program any of whose values would hold more than :data:`MAX_VALUE_ELEMENTS` elements per example (a
  ``zeros`` or ``repeat`` sized by the file); it also returns the elements the program's values hold per example,
  from which the worker's memory admission is taken.

The result is differentiable with respect to its input (the weights are constants), which is all Integrated
Gradients needs; its outputs equal the eager model's (tests compare them with the model the program was exported
from).
"""

from __future__ import annotations

import operator
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.export.files import ATEN_PREFIX, LOCAL, FileAccess, Payload, ProgramInfo, inspect_program
from models.export.spec import ModelSpec, check_spec, output_name

MAX_VALUE_ELEMENTS = 1 << 28  # one value of the graph, per example (1 GiB of float32)
TORCH_DTYPES = {"uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
                "int64": torch.int64, "float16": torch.float16, "float32": torch.float32,
                "float64": torch.float64, "bool": torch.bool, "bfloat16": torch.bfloat16}
SCALAR_TYPES = {1: torch.uint8, 2: torch.int8, 3: torch.int16, 4: torch.int32, 5: torch.int64, 6: torch.float16,
                7: torch.float32, 8: torch.float64, 12: torch.bool, 13: torch.bfloat16}
MEMORY_FORMATS = {0: None, 1: torch.contiguous_format, 2: torch.channels_last, 3: torch.channels_last_3d,
                  4: torch.preserve_format}
SYM = {"_operator.add": operator.add, "_operator.sub": operator.sub, "_operator.mul": operator.mul,
       "_operator.floordiv": operator.floordiv, "_operator.mod": operator.mod, "_operator.neg": operator.neg,
       "_operator.truediv": operator.truediv, "_operator.eq": operator.eq, "_operator.ne": operator.ne,
       "_operator.ge": operator.ge, "_operator.gt": operator.gt, "_operator.le": operator.le,
       "_operator.lt": operator.lt}


class ProgramRunError(ValueError):
    """A checked program that does not run (an operator refuses its arguments, a value too large)."""


ASSERT_METADATA = ATEN_PREFIX + "_assert_tensor_metadata.default"


def _checked(*args: Any, **kwargs: Any) -> None:
    return None


def _resolve(target: str) -> Callable[..., Any]:
    """The callable of a checked target (:func:`models.export.files._check_operator` accepted it)."""
    if target in SYM:
        return SYM[target]
    if target == ASSERT_METADATA:  # a check export adds around dtype casts; the interpreter runs none of it
        return _checked
    parts = target[len(ATEN_PREFIX):].split(".")
    packet = getattr(torch.ops.aten, parts[0])
    return getattr(packet, parts[1]) if len(parts) == 2 else packet


@dataclass
class _Node:
    name: str
    op: Callable[..., Any]
    target: str
    args: list[tuple[int, str, dict[str, Any]]]   # (kind, name, serialized argument)
    outputs: list[dict[str, Any]]
    value: str | None = None  # the name of its one tensor output (what ``replace`` names)


class Program(torch.nn.Module):
    """The checked graph as a module: ``forward(*inputs)`` computes the program's output for its user inputs (in
    the program's order). ``replace`` (value name -> tensor) gives some nodes' outputs instead of computing them:
    a token program's embedding call is replaced by the embeddings IG interpolates, every other node computing on
    the real inputs."""

    def __init__(self, info: ProgramInfo, tensors: dict[str, torch.Tensor]):
        super().__init__()
        graph = info.program["graph_module"]["graph"]
        self._inputs = [a["as_tensor"]["name"] for a in graph["inputs"]]
        self._outputs = graph["outputs"]
        self._users = [i.name for i in info.inputs]
        self._state = {name: fqn for name, (_, fqn) in info.state.items()}
        for i, (_, fqn) in enumerate(sorted(self._state.items())):
            self.register_buffer(f"t{i}", tensors[fqn], persistent=False)
        self._slot = {name: f"t{i}" for i, (name, _) in enumerate(sorted(self._state.items()))}
        self._nodes = [_Node(str(n.get("name")), _resolve(n["target"]), n["target"],
                             [(int(a.get("kind", 1)), a["name"], a["arg"]) for a in n.get("inputs") or []],
                             n.get("outputs") or [], output_name(n)) for n in graph["nodes"]]
        self.check_values: int | None = None  # per-example element bound while dry-running
        self.counted = 0                      # elements of the values made while dry-running

    def state_tensor(self, name: str) -> torch.Tensor:
        """The tensor the graph input ``name`` (a parameter, buffer or constant) runs with."""
        return getattr(self, self._slot[name])

    @property
    def device(self) -> torch.device:
        for b in self.buffers():
            return b.device
        return torch.device("cpu")

    def _value(self, arg: dict[str, Any], env: dict[str, Any]) -> Any:
        (kind, v), = arg.items()
        if kind == "as_none":
            return None
        if kind == "as_tensor":
            return env[v["name"]]
        if kind == "as_tensors":
            return [env[t["name"]] for t in v]
        if kind == "as_optional_tensor":
            return self._value(v, env) if "as_tensor" in v else None
        if kind == "as_optional_tensors":
            return [env[t["as_tensor"]["name"]] if "as_tensor" in t else None for t in v]
        if kind in ("as_int", "as_ints", "as_float", "as_floats", "as_bool", "as_bools", "as_string"):
            return list(v) if isinstance(v, list) else v
        if kind == "as_scalar_type":
            if v not in SCALAR_TYPES:
                raise ProgramRunError(f"dtype {v!r} is not one the service runs")
            return SCALAR_TYPES[v]
        if kind == "as_memory_format":
            return MEMORY_FORMATS.get(v)
        if kind == "as_layout":
            return torch.strided
        if kind == "as_device":
            return self.device
        if kind in ("as_sym_int", "as_sym_float", "as_sym_bool"):
            return self._sym(v, env)
        if kind == "as_sym_ints":
            return [self._sym(s, env) for s in v]
        raise ProgramRunError(f"argument kind {kind!r} is not one the service runs")

    @staticmethod
    def _sym(v: dict[str, Any], env: dict[str, Any]) -> Any:
        (kind, x), = v.items()
        return env[x] if kind == "as_name" else x

    def _store(self, node: _Node, out: Any, env: dict[str, Any]) -> None:
        outs = node.outputs
        if not outs:  # an assertion (aten._assert_tensor_metadata): nothing to keep
            return
        values = [out] if len(outs) == 1 else list(out)
        if len(values) != len(outs):
            raise ProgramRunError(f"node {node.name} gave {len(values)} values for {len(outs)} outputs")
        for spec, value in zip(outs, values, strict=True):
            (kind, v), = spec.items()
            if kind == "as_tensor":
                env[v["name"]] = value
            elif kind == "as_tensors":
                for t, val in zip(v, value, strict=True):
                    env[t["name"]] = val
            elif kind in ("as_sym_int", "as_sym_float", "as_sym_bool"):
                if "as_name" in v:
                    env[v["as_name"]] = value
            elif kind != "as_none":
                raise ProgramRunError(f"node {node.name} has an output of kind {kind!r}")

    def _bound(self, node: _Node, env: dict[str, Any]) -> None:
        for spec in node.outputs:
            (kind, v), = spec.items()
            names = [v["name"]] if kind == "as_tensor" else [t["name"] for t in v] if kind == "as_tensors" else []
            for n in names:
                t = env.get(n)
                if isinstance(t, torch.Tensor):
                    self.counted += t.numel()
                if isinstance(t, torch.Tensor) and t.numel() > self.check_values:  # type: ignore[operator]
                    raise ProgramRunError(f"node {node.name} ({node.target.removeprefix('torch.ops.')}) makes a "
                                          f"value of {t.numel():,} elements for one example; the most the service "
                                          f"runs is {self.check_values:,}")

    def forward(self, *xs: torch.Tensor, replace: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        if len(xs) != len(self._users):
            raise ProgramRunError(f"the program takes {len(self._users)} inputs, got {len(xs)}")
        given = dict(zip(self._users, xs, strict=True))
        env: dict[str, Any] = {}
        for name in self._inputs:
            env[name] = given[name] if name in given else getattr(self, self._slot[name])
        for node in self._nodes:
            if replace and node.value in replace:
                self._store(node, replace[node.value], env)
                continue
            args: list[Any] = []
            kwargs: dict[str, Any] = {}
            for kind, name, arg in node.args:
                value = self._value(arg, env)
                if kind == 1:
                    args.append(value)
                else:
                    kwargs[name] = value
            try:
                out = node.op(*args, **kwargs)
            except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as exc:
                raise ProgramRunError(f"node {node.name} ({node.target.removeprefix('torch.ops.')}) failed: "
                                      f"{str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}") \
                    from None
            self._store(node, out, env)
            if self.check_values is not None:
                self._bound(node, env)
        outs = [self._value(o, env) for o in self._outputs]
        return outs[0]


def _payload_tensor(zf: zipfile.ZipFile, p: Payload, device: torch.device | str) -> torch.Tensor:
    with zf.open(p.path) as fh:
        data = bytearray(fh.read(p.extent() * p.itemsize + 1))
    dtype = TORCH_DTYPES[p.dtype]
    n = p.extent()
    flat = torch.frombuffer(data, dtype=dtype, count=n) if n else torch.empty(0, dtype=dtype)
    return torch.as_strided(flat, p.sizes, p.strides, p.offset).clone().to(device)


def read_tensors(path: Path, info: ProgramInfo, files: FileAccess = LOCAL, device: torch.device | str = "cpu"
                 ) -> dict[str, torch.Tensor]:
    """Every weight and constant of the checked archive, from raw bytes, on ``device``."""
    out: dict[str, torch.Tensor] = {}
    with files.open(Path(path), "program") as fh, zipfile.ZipFile(fh) as zf:
        for table in (info.weights, info.constants):
            for fqn, p in table.items():
                out[fqn] = _payload_tensor(zf, p, device)
    return out


def dry_run(info: ProgramInfo, spec: ModelSpec) -> int:
    """Run the checked program on the meta device with one example (shapes only: no weight is read, no value is
    allocated); ProgramRunError when it fails or a value exceeds :data:`MAX_VALUE_ELEMENTS`. Returns the elements
    of all its values for that example."""
    tensors = {fqn: torch.empty(p.sizes, dtype=TORCH_DTYPES[p.dtype], device="meta")
               for table in (info.weights, info.constants) for fqn, p in table.items()}
    meta = Program(info, tensors)
    meta.check_values = MAX_VALUE_ELEMENTS
    x = torch.zeros((1, *spec.shape), dtype=TORCH_DTYPES[spec.dtype], device="meta")
    xs = program_inputs(spec, x)  # a token program at its longest sequence, with its attention mask
    with torch.no_grad():
        out = meta(*xs)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, len(spec.labels)):
        raise ProgramRunError(f"for one example the program gives {tuple(getattr(out, 'shape', ()))}, not "
                              f"(1, {len(spec.labels)}) logits")
    return meta.counted + sum(v.numel() for v in xs)


def program_inputs(spec: ModelSpec, x: torch.Tensor) -> list[torch.Tensor]:
    """The program's inputs for ``x`` (the attributed input): ``[x]``, or for token ids with an attention mask
    the ids and the mask (1 where the ids are not ``pad_id``), in the program's order."""
    tok = spec.tokens
    if tok is None or tok.attention_mask is None:
        return [x]
    mask = (x != tok.pad_id).to(TORCH_DTYPES[tok.mask_dtype or "int64"])
    return [mask if name == tok.attention_mask else x for name in tok.inputs]


@dataclass
class ExportedClassifier:
    """A loaded exported classifier: the program (frozen, on ``device``), its checked spec and archive info."""

    program: Program
    spec: ModelSpec
    info: ProgramInfo
    path: Path
    elements_per_example: int  # of all the program's values for one example (the dry run's count)

    @property
    def labels(self) -> list[str]:
        return self.spec.labels

    @property
    def parameters(self) -> int:
        return self.info.parameters

    @property
    def device(self) -> torch.device:
        return self.program.device

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.spec.dtype]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, classes]`` of ``x`` ``[batch, *shape]`` (cast to the program's input dtype; token ids
        ``[batch, tokens]`` with their attention mask made by :func:`program_inputs`)."""
        return self.program(*program_inputs(self.spec, x.to(self.dtype)))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """A token program's embeddings ``[batch, tokens, dim]`` of ``ids``: its table's rows, as its embedding
        call computes them."""
        tok = self.spec.tokens
        if tok is None:
            raise ValueError("the model takes no token ids")
        return torch.nn.functional.embedding(ids.to(self.device), self.program.state_tensor(tok.table))

    def forward_embedded(self, ids: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """Logits of a token program whose embedding call gives ``e`` ``[batch, tokens, dim]`` for ``ids`` (every
        other node, the attention mask included, computes on ``ids``)."""
        tok = self.spec.tokens
        if tok is None:
            raise ValueError("the model takes no token ids")
        return self.program(*program_inputs(self.spec, ids.to(self.device)), replace={tok.node: e})

    @torch.no_grad()
    def logits(self, x: torch.Tensor, batch: int = 256) -> torch.Tensor:
        return torch.cat([self.forward(x[s:s + batch].to(self.device)).float().cpu()
                          for s in range(0, x.shape[0], batch)]) if x.shape[0] else torch.empty(0, len(self.labels))


PROGRAM_FILE = "model.pt2"
SPEC_FILE = "spec.json"


def _read_beside(archive: Path, name: str, files: FileAccess) -> bytes:
    """A file the spec names (a plain name, :func:`models.export.spec.check_spec` checked it) beside the archive,
    read up to one byte past the spec's bound."""
    from models.export.spec import MAX_VOCABULARY_BYTES, SpecError

    try:
        with files.open(archive.parent / name, "vocabulary") as fh:
            return fh.read(MAX_VOCABULARY_BYTES + 1)
    except OSError as exc:
        raise SpecError(("input", "vocabulary"), f"{name} cannot be read ({exc.strerror or 'no such file'})") \
            from None
    except ValueError as exc:  # the user-file opener's refusal (outside the data roots, too large)
        raise SpecError(("input", "vocabulary"), str(exc)) from None


def build(archive: Path, spec: Any, device: torch.device | str = "cpu", files: FileAccess = LOCAL
          ) -> ExportedClassifier:
    """Check ``archive`` and ``spec`` (a dict; a file it names, the vocabulary, is read beside the archive),
    dry-run the program, then read the tensors."""
    info = inspect_program(Path(archive), files)
    checked = check_spec(spec, info, lambda name: _read_beside(Path(archive), name, files))
    elements = dry_run(info, checked)  # before any weight is read
    program = Program(info, read_tensors(Path(archive), info, files, device))
    program.eval()
    return ExportedClassifier(program, checked, info, Path(archive), elements)


def load(path: str | Path, device: torch.device | str = "cpu", files: FileAccess = LOCAL) -> ExportedClassifier:
    """A registered exported classifier (``models.export.program:load``): ``model.pt2`` and ``spec.json`` in
    ``path``."""
    import json

    path = Path(path)
    with files.open(path / SPEC_FILE, "json") as fh:
        spec = json.loads(fh.read())
    return build(path / PROGRAM_FILE, spec, device, files)
