"""What a ``torch.export`` program archive (``.pt2``) must be before anything loads it (no torch: the API checks it).

``torch.export.load`` is not safe on a file a tenant sends: it unpickles the archive's sample inputs (falling back
to ``weights_only=False``), any weight or constant marked ``use_pickle`` and any opaque object, ``exec``\\ s the
program's ``guards_code`` when it builds the module, and passes every symbolic size's ``expr_str`` to
``sympy.sympify`` (an ``eval``). The service therefore never calls it. A program is taken only as data:

- the zip archive (at most :data:`MAX_ENTRIES` entries, names inside one top folder) with ``archive_format``
  ``pt2`` and exactly one program (``models/<name>.json``);
- the program's JSON (at most :data:`MAX_PROGRAM_BYTES`) with a schema version this reader knows, whose every node
  calls an operator of :data:`OPERATORS` (ATen operators that compute on tensors; no custom namespace, no
  higher-order operator or sub-graph, no operator that reads files or allocates by a size the file chooses beyond
  the bounds below) with arguments of the kinds :data:`ARGUMENTS`;
- the weights and constants as raw tensor bytes described by JSON (``use_pickle`` refused; a tensor's bytes must
  lie inside its file); ``sample_inputs`` (a pickle) and ``guards_code`` are never read or run, and no symbolic
  expression is ever evaluated (a dynamic size is only recorded as dynamic).

:func:`inspect_program` returns what the program takes and gives (:class:`ProgramInfo`);
:mod:`models.export.program` runs it with its own interpreter over these checked nodes.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.files import LOCAL, FileAccess

MAX_ENTRIES = 100_000
MAX_PROGRAM_BYTES = 64 << 20
MAX_CONFIG_BYTES = 16 << 20
MAX_NODES = 50_000
MAX_TENSORS = 20_000
MAX_DIMS = 8
MAX_DIM = 1 << 31
SCHEMA_MAJOR = 8
CONVERT = ("export it with torch.export.export(model.eval(), args, dynamic_shapes=...) and save it with "
           "torch.export.save(program, 'model.pt2') (torch 2.6 or newer)")

# ScalarType (torch/_export/serde/schema.py) -> (name, bytes per element)
DTYPES: dict[int, tuple[str, int]] = {
    1: ("uint8", 1), 2: ("int8", 1), 3: ("int16", 2), 4: ("int32", 4), 5: ("int64", 8), 6: ("float16", 2),
    7: ("float32", 4), 8: ("float64", 8), 12: ("bool", 1), 13: ("bfloat16", 2),
}
FLOAT_DTYPES = ("float16", "float32", "float64", "bfloat16")
STRIDED = 7  # Layout.Strided

# The argument kinds the interpreter resolves (schema.Argument's union fields).
ARGUMENTS = frozenset({
    "as_none", "as_tensor", "as_tensors", "as_optional_tensors", "as_optional_tensor", "as_int", "as_ints",
    "as_float", "as_floats", "as_bool", "as_bools", "as_string", "as_scalar_type", "as_memory_format",
    "as_layout", "as_device", "as_sym_int", "as_sym_ints", "as_sym_float", "as_sym_bool",
})

# The ATen operators (overload packets) a program may call: arithmetic, activations, reductions, shape and indexing,
# linear algebra, convolution, pooling, normalisation, embedding, attention, dropout in eval. Nothing that reads
# or writes files, allocates from storage it names, or runs a sub-graph.
_ATEN = """
abs acos acosh adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d
add addcdiv addcmul addmm alias all amax amin any arange argmax argmin as_strided asin asinh atan atan2 atanh
avg_pool1d avg_pool2d avg_pool3d baddbmm batch_norm bitwise_and bitwise_not bitwise_or bmm bucketize cat ceil
chunk clamp clamp_max clamp_min clip clone constant_pad_nd contiguous conv1d conv2d conv3d conv_transpose1d
conv_transpose2d convolution cos cosh cumprod cumsum detach diag diagonal div dropout einsum elu embedding empty
empty_like eq erf erfc exp exp2 expand expand_as expm1 feature_dropout fill flatten flip floor floor_divide fmod
full full_like gather ge gelu glu group_norm gt hardsigmoid hardswish hardtanh index index_select instance_norm
isinf isnan layer_norm le leaky_relu lerp linear log log10 log1p log2 log_softmax logical_and logical_not
logical_or logsumexp lt masked_fill matmul max max_pool1d max_pool2d max_pool3d maximum mean min minimum mish mm
mul narrow native_layer_norm ne neg new_ones new_zeros norm ones ones_like pad permute pixel_shuffle pow prelu
prod reciprocal relu relu6 remainder repeat repeat_interleave reshape roll round rsqrt rsub scalar_tensor
scaled_dot_product_attention select selu sigmoid sign silu sin sinh slice softmax softplus split split_with_sizes
sqrt square squeeze stack std sub sum t tan tanh tensor_split tile topk transpose tril triu true_divide type_as
unbind unflatten unsqueeze upsample_bilinear2d upsample_nearest2d var view where zeros zeros_like _to_copy to
_log_softmax _softmax _native_batch_norm_legit_no_training _native_batch_norm_legit_functional sym_size sym_numel
sym_stride lift_fresh_copy alias_copy view_copy permute_copy squeeze_copy unsqueeze_copy expand_copy t_copy
select_copy slice_copy _unsafe_view max_pool2d_with_indices adaptive_max_pool2d_backward linalg_vector_norm _assert_tensor_metadata __and__ __or__ __xor__ __invert__ bitwise_xor
"""
ATEN_OPERATORS = frozenset(_ATEN.split())
# Python's own operators on sizes (a reshape by ``x.shape[0]``); no other Python callable is run.
SYM_OPERATORS = frozenset({"_operator.add", "_operator.sub", "_operator.mul", "_operator.floordiv",
                           "_operator.mod", "_operator.neg", "_operator.truediv", "_operator.eq", "_operator.ne",
                           "_operator.ge", "_operator.gt", "_operator.le", "_operator.lt"})
ATEN_PREFIX = "torch.ops.aten."
# Tensor factories take their size from the program: bounded so that a program cannot ask for more than this.
MAX_FACTORY_ELEMENTS = 1 << 28


class ProgramError(ValueError):
    """A program archive the service will not load, with the reason and what to do."""


@dataclass
class TensorInfo:
    """A user input's or output's declared type: its name, dtype and shape (None for a dynamic dimension)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def shown(self) -> str:
        return "[" + ", ".join("batch" if d is None else str(d) for d in self.shape) + "]"


@dataclass
class Payload:
    """One weight or constant stored as raw bytes: the file under ``data/weights`` (or ``constants``), its dtype,
    sizes, strides and storage offset in elements."""

    path: str
    dtype: str
    itemsize: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    requires_grad: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    def extent(self) -> int:
        """Elements of storage the view reaches (offset + the farthest element + 1; 0 for an empty tensor)."""
        if self.numel == 0:
            return 0
        return self.offset + sum((s - 1) * st for s, st in zip(self.sizes, self.strides, strict=True)) + 1


@dataclass
class ProgramInfo:
    """What an archive holds, read as data."""

    prefix: str                       # the archive's top folder ("model/")
    model: str                        # the program's name inside it ("model")
    program: dict[str, Any]           # the program's JSON (checked)
    inputs: list[TensorInfo]          # user inputs, in call order
    outputs: list[TensorInfo]         # user outputs
    operators: list[str]              # the operators its nodes call, sorted
    state: dict[str, tuple[str, str]] = field(default_factory=dict)  # graph input name -> (kind, fqn)
    weights: dict[str, Payload] = field(default_factory=dict)        # fqn -> payload
    constants: dict[str, Payload] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)            # archive member -> size

    @property
    def parameters(self) -> int:
        return sum(p.numel for p in self.weights.values())

    @property
    def nbytes(self) -> int:
        return sum(p.numel * p.itemsize for p in (*self.weights.values(), *self.constants.values()))


def _fail(message: str) -> ProgramError:
    return ProgramError(message)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -MAX_DIM <= value <= MAX_DIM:
        raise _fail(f"{what} is not an integer the reader accepts")
    return value


def _sym(value: Any, what: str) -> int | None:
    """A serialized SymInt of a size: ``as_int`` (static), or ``as_expr`` (dynamic; the expression is never
    evaluated)."""
    if not isinstance(value, dict) or len(value) != 1:
        raise _fail(f"{what} is not a serialized size")
    (kind, v), = value.items()
    if kind == "as_int":
        return _int(v, what)
    if kind == "as_expr":
        return None
    raise _fail(f"{what}: unknown size kind {kind!r}")


def _tensor_meta(meta: Any, what: str) -> tuple[str, int, tuple[int | None, ...]]:
    if not isinstance(meta, dict):
        raise _fail(f"{what} has no tensor metadata")
    dtype = DTYPES.get(meta.get("dtype"))
    if dtype is None:
        raise _fail(f"{what} has a dtype the service does not run ({meta.get('dtype')!r}; it takes "
                    f"{', '.join(n for n, _ in DTYPES.values())})")
    if meta.get("layout", STRIDED) != STRIDED:
        raise _fail(f"{what} is not a dense (strided) tensor")
    sizes = meta.get("sizes")
    if not isinstance(sizes, list) or len(sizes) > MAX_DIMS:
        raise _fail(f"{what} has more than {MAX_DIMS} dimensions or no sizes")
    return dtype[0], dtype[1], tuple(_sym(s, f"{what}'s size") for s in sizes)


def _payloads(config: Any, kind: str, entries: dict[str, int], folder: str) -> dict[str, Payload]:
    if not isinstance(config, dict) or not isinstance(config.get("config"), dict):
        raise _fail(f"the {kind} description is not a JSON object with a config")
    out: dict[str, Payload] = {}
    for fqn, meta in config["config"].items():
        if not isinstance(meta, dict):
            raise _fail(f"{kind} {fqn!r} has no description")
        if meta.get("use_pickle"):
            raise _fail(f"{kind} {fqn!r} is stored as a pickle, which the service never opens; {CONVERT}, with "
                        "plain dense tensors as weights")
        path = meta.get("path_name")
        if not isinstance(path, str) or "/" in path or path in ("", ".", "..") or folder + path not in entries:
            raise _fail(f"{kind} {fqn!r} names no file of the archive")
        if kind == "constant" and not path.startswith("tensor_"):
            raise _fail(f"constant {fqn!r} is not a tensor (a script or opaque object would be unpickled)")
        dtype, itemsize, sizes = _tensor_meta(meta.get("tensor_meta"), f"{kind} {fqn!r}")
        tm = meta["tensor_meta"]
        strides = tuple(_int(_sym(s, f"{kind} {fqn!r}'s stride"), f"{kind} {fqn!r}'s stride")
                        for s in tm.get("strides") or [])
        if None in sizes or len(strides) != len(sizes) or any(s < 0 for s in (*sizes, *strides)):
            raise _fail(f"{kind} {fqn!r} has invalid sizes or strides")
        offset = _int(_sym(tm.get("storage_offset", {"as_int": 0}), f"{kind} {fqn!r}'s offset") or 0, "offset")
        p = Payload(folder + path, dtype, itemsize, tuple(int(s) for s in sizes), strides, max(offset, 0),
                    bool(tm.get("requires_grad")))
        if p.extent() * itemsize > entries[p.path]:
            raise _fail(f"{kind} {fqn!r} reaches past the end of its file ({p.extent() * itemsize} bytes of "
                        f"{entries[p.path]})")
        out[fqn] = p
    return out


def _check_argument(arg: Any, where: str) -> None:
    if not isinstance(arg, dict) or len(arg) != 1:
        raise _fail(f"{where}: an argument is not a serialized value")
    (kind, _), = arg.items()
    if kind == "as_graph":
        raise _fail(f"{where} runs a sub-graph (control flow such as torch.cond or a loop), which the service "
                    "does not run; export a model without data-dependent control flow")
    if kind not in ARGUMENTS:
        raise _fail(f"{where}: an argument of kind {kind!r} (custom objects, operators as values, ...) is not "
                    "one the service runs")


def operator_name(target: Any) -> str:
    """``torch.ops.aten.conv2d.default`` -> ``aten.conv2d.default``; a Python operator as it is."""
    if not isinstance(target, str):
        return repr(target)
    return target[len("torch.ops."):] if target.startswith("torch.ops.") else target


def _check_operator(target: Any, where: str) -> None:
    if isinstance(target, str) and target in SYM_OPERATORS:
        return
    if isinstance(target, str) and target.startswith(ATEN_PREFIX):
        parts = target[len(ATEN_PREFIX):].split(".")
        if len(parts) in (1, 2) and parts[0] in ATEN_OPERATORS and all(p.isidentifier() for p in parts):
            return
        raise _fail(f"{where} calls {operator_name(target)}, an ATen operator the service does not run (it runs "
                    "the operators that compute on tensors, not those that read files or allocate storage)")
    name = operator_name(target)
    if isinstance(target, str) and target.startswith("torch.ops.higher_order."):
        raise _fail(f"{where} calls {name}, a higher-order operator (control flow or a wrapped sub-graph), which "
                    "the service does not run")
    raise _fail(f"{where} calls {name!s:.120}, which is not an ATen operator: custom operators (any namespace "
                "but aten) need their Python or C++ code, which the service never loads")


def _read_member(zf: zipfile.ZipFile, name: str, cap: int) -> bytes:
    info = zf.getinfo(name)
    if info.file_size > cap:
        raise _fail(f"{name.split('/', 1)[-1]} is {info.file_size} bytes; the most the reader takes is {cap}")
    with zf.open(info) as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise _fail(f"{name.split('/', 1)[-1]} is more than {cap} bytes")
    return data


def _json(zf: zipfile.ZipFile, name: str, cap: int) -> Any:
    try:
        return json.loads(_read_member(zf, name, cap).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _fail(f"{name.split('/', 1)[-1]} is not JSON ({type(exc).__name__})") from None


def _entries(zf: zipfile.ZipFile) -> tuple[str, dict[str, int]]:
    infos = zf.infolist()
    if len(infos) > MAX_ENTRIES:
        raise _fail(f"the archive has {len(infos)} entries; the most the reader takes is {MAX_ENTRIES}")
    entries: dict[str, int] = {}
    tops: set[str] = set()
    for info in infos:
        name = info.filename
        parts = name.split("/")
        if name.startswith("/") or "\\" in name or any(p in ("..", ".") for p in parts) or len(parts) < 2:
            raise _fail(f"the archive has an entry outside one top folder ({name[:80]!r})")
        tops.add(parts[0])
        if not info.is_dir():
            entries[name] = info.file_size
    if len(tops) != 1:
        raise _fail("the archive's entries are not under one top folder (it is not a torch.export archive)")
    return tops.pop() + "/", entries


def _signature(program: dict[str, Any]) -> tuple[dict[str, tuple[str, str]], list[str], list[str]]:
    """(graph input name -> (parameter/buffer/constant, fqn), user input names, user output names)."""
    sig = program.get("graph_module", {}).get("signature")
    if not isinstance(sig, dict):
        raise _fail("the program has no signature")
    state: dict[str, tuple[str, str]] = {}
    user_in: list[str] = []
    for spec in sig.get("input_specs") or []:
        if not isinstance(spec, dict) or len(spec) != 1:
            raise _fail("an input spec of the program is malformed")
        (kind, v), = spec.items()
        if kind == "user_input":
            arg = v.get("arg") if isinstance(v, dict) else None
            if not isinstance(arg, dict) or "as_tensor" not in arg:
                raise _fail("a program input is not a tensor (constant or non-tensor inputs are not supported; "
                            "make them module attributes before exporting)")
            user_in.append(str(arg["as_tensor"].get("name")))
        elif kind in ("parameter", "buffer", "tensor_constant"):
            key = {"parameter": "parameter_name", "buffer": "buffer_name", "tensor_constant": "tensor_constant_name"}
            state[str(v["arg"]["name"])] = (kind, str(v.get(key[kind])))
        else:
            raise _fail(f"the program takes a {kind} input (custom objects or effect tokens), which the service "
                        "does not run")
    user_out: list[str] = []
    for spec in sig.get("output_specs") or []:
        if not isinstance(spec, dict) or len(spec) != 1:
            raise _fail("an output spec of the program is malformed")
        (kind, v), = spec.items()
        if kind != "user_output":
            raise _fail(f"the program has a {kind} output: it mutates a buffer or an input (a module in training "
                        "mode?); export the model in eval mode, model.eval(), so it only computes outputs")
        arg = v.get("arg") if isinstance(v, dict) else None
        if not isinstance(arg, dict) or "as_tensor" not in arg:
            raise _fail("a program output is not a tensor")
        user_out.append(str(arg["as_tensor"].get("name")))
    return state, user_in, user_out


def inspect_program(path: Path, files: FileAccess = LOCAL) -> ProgramInfo:
    """Read the archive at ``path`` as data and check it (:class:`ProgramError` with the reason otherwise)."""
    try:
        with files.open(Path(path), "program") as fh, zipfile.ZipFile(fh) as zf:
            return _inspect(zf)
    except zipfile.BadZipFile:
        raise _fail(f"{files.display(Path(path))} is not a zip archive; {CONVERT}") from None
    except (zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        raise _fail(f"the archive cannot be read ({exc})") from None


def _inspect(zf: zipfile.ZipFile) -> ProgramInfo:
    prefix, entries = _entries(zf)
    fmt = prefix + "archive_format"
    if fmt not in entries or _read_member(zf, fmt, 64).strip() != b"pt2":
        raise _fail(f"the archive is not a torch.export program (no archive_format 'pt2'); {CONVERT}")
    if any(n.startswith(prefix + "data/aotinductor/") or n.endswith((".so", ".dll", ".dylib", ".cubin"))
           for n in entries):
        raise _fail("the archive holds compiled code (an AOTInductor package), which the service never loads; "
                    "save the exported program itself with torch.export.save")
    order = prefix + "byteorder"
    if order in entries and _read_member(zf, order, 64).strip() not in (b"little", b""):
        raise _fail("the archive's tensors are big-endian; save it on a little-endian machine")
    models = [n for n in entries if n.startswith(prefix + "models/") and n.endswith(".json")]
    if len(models) != 1:
        raise _fail(f"the archive holds {len(models)} programs; the service takes one ({CONVERT})")
    model = models[0][len(prefix + "models/"):-len(".json")]
    if "/" in model or not model:
        raise _fail("the program's name is not a plain name")
    if prefix + f"data/weights/{model}.pt" in entries or prefix + f"data/constants/{model}.pt" in entries:
        raise _fail(f"the weights are in the legacy pickled form, which the service never opens; {CONVERT}")
    program = _json(zf, models[0], MAX_PROGRAM_BYTES)
    if not isinstance(program, dict) or not isinstance(program.get("graph_module"), dict):
        raise _fail("the program's JSON has no graph")
    version = program.get("schema_version") or {}
    if not isinstance(version, dict) or version.get("major") != SCHEMA_MAJOR:
        raise _fail(f"the program was saved in schema version {version.get('major') if isinstance(version, dict) else version!r}; the "
                    f"service reads version {SCHEMA_MAJOR} (torch 2.6 and newer): {CONVERT}")
    graph = program["graph_module"].get("graph")
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise _fail("the program's graph has no nodes")
    if graph.get("custom_obj_values"):
        raise _fail("the program holds custom objects (torchbind), which the service does not run")
    nodes = graph["nodes"]
    if len(nodes) > MAX_NODES:
        raise _fail(f"the program has {len(nodes)} nodes; the most the service runs is {MAX_NODES}")
    ops: set[str] = set()
    for i, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise _fail(f"node {i} is malformed")
        where = f"node {i} ({str(node.get('name'))[:60]})"
        _check_operator(node.get("target"), where)
        ops.add(operator_name(node["target"]))
        for a in node.get("inputs") or []:
            if not isinstance(a, dict) or a.get("kind", 1) not in (1, 2) or not isinstance(a.get("name"), str):
                raise _fail(f"{where}: an argument is malformed")
            _check_argument(a.get("arg"), where)
        for o in node.get("outputs") or []:
            _check_argument(o, where)
    tensor_values = graph.get("tensor_values")
    if not isinstance(tensor_values, dict) or len(tensor_values) > MAX_TENSORS * 10:
        raise _fail("the program's tensor table is missing or too large")
    state, user_in, user_out = _signature(program)

    def info(name: str, what: str) -> TensorInfo:
        dtype, _, shape = _tensor_meta(tensor_values.get(name), f"{what} {name!r}")
        return TensorInfo(name, dtype, shape)

    inputs = [info(n, "input") for n in user_in]
    outputs = [info(n, "output") for n in user_out]
    weights_cfg = prefix + f"data/weights/{model}_weights_config.json"
    const_cfg = prefix + f"data/constants/{model}_constants_config.json"
    weights = _payloads(_json(zf, weights_cfg, MAX_CONFIG_BYTES), "weight", entries, prefix + "data/weights/") \
        if weights_cfg in entries else {}
    constants = _payloads(_json(zf, const_cfg, MAX_CONFIG_BYTES), "constant", entries,
                          prefix + "data/constants/") if const_cfg in entries else {}
    if len(weights) + len(constants) > MAX_TENSORS:
        raise _fail(f"the program has more than {MAX_TENSORS} weights and constants")
    for kind, fqn in state.values():
        if fqn not in weights and fqn not in constants:
            raise _fail(f"the program's {kind} {fqn!r} has no stored tensor")
    return ProgramInfo(prefix, model, program, inputs, outputs, sorted(ops), state, weights, constants, entries)
