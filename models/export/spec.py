"""The declared spec of an exported classifier, checked against its program (no torch).

An exported program says the types of its inputs and outputs; the spec says what they mean, so that the service
can build baselines, draw the attributions and name the classes::

    {"input": {"name": "x", "kind": "image", "shape": ["batch", 1, 8, 8], "dtype": "float32",
               "mean": [0.3]},
     "labels": ["0", "1", ..., "9"]}

- ``input``: the attributed input. ``kind`` is ``image`` (shape ``[batch, channels, height, width]``, channels
  first, at most :data:`MAX_CHANNELS` channels) or ``tabular`` (``[batch, features]``, with optional ``features``
  names). ``name``, ``shape`` and ``dtype`` are optional; when given they must agree with the program (a mismatch
  is a :class:`SpecError` naming the spec's field). ``mean`` (optional) is the training mean per channel (image)
  or per feature (tabular), the ``mean`` baseline.
- ``labels``: the class names in logit order (by default ``"0"``, ``"1"``, ...). The program's one output must be
  ``[batch, len(labels)]`` logits.

An image or tabular program must take exactly one tensor input, floating point (IG differentiates with respect to
it), with a dynamic batch dimension and every other dimension static.

A text program takes token ids: ``kind`` ``tokens`` (``[batch, tokens]``, int64, a dynamic batch; the sequence
length static, or dynamic up to ``max_tokens``), and ``embedding`` names the table IG attributes over: the
program's parameter (or buffer) that an ``aten.embedding.default`` call of the graph reads with that input as its
indices, checked in the graph (:func:`embedding_node`). Optional: ``pad_id`` and ``mask_id`` (the ``pad`` and
``mask`` baselines' tokens; positions holding ``pad_id`` are padding: no word, the attention mask's zeros),
``special_ids`` (structural tokens such as [CLS], kept in every baseline: no word), ``vocabulary`` (a file of the
model directory, one token per line, line ``i`` naming id ``i``, :data:`MAX_VOCABULARY_BYTES` at most, read as
text only) and ``attention_mask`` (the name of a second program input of the ids' shape that the service fills:
1 at every position that is not ``pad_id``)::

    {"input": {"kind": "tokens", "name": "ids", "embedding": "embed.weight", "shape": ["batch", "tokens"],
               "max_tokens": 64, "pad_id": 0, "mask_id": 1, "vocabulary": "vocab.txt",
               "attention_mask": "mask"},
     "labels": ["negative", "positive"]}
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from models.export.files import ATEN_PREFIX, FLOAT_DTYPES, ProgramInfo, TensorInfo

KINDS = ("image", "tabular", "tokens")
MAX_CHANNELS = 16
MAX_INPUT_VALUES = 3 * 512 * 512      # one input's elements (a 512x512 RGB image)
MAX_LABELS = 10_000
MAX_NAME = 200
SPEC_KEYS = {"input", "labels"}
INPUT_KEYS = {"name", "kind", "shape", "dtype", "features", "mean"}
TOKEN_KEYS = {"name", "kind", "shape", "dtype", "embedding", "max_tokens", "min_tokens", "pad_id", "mask_id",
              "special_ids", "vocabulary", "vocab_size", "attention_mask"}
MAX_TOKENS = 4096                      # a token input's longest sequence
MAX_VOCABULARY = 1 << 22               # rows of an embedding table
MAX_VOCABULARY_BYTES = 16 << 20        # the vocabulary file
MAX_TOKEN_CHARS = 100                  # one line of it
MAX_SPECIAL_IDS = 1000
MASK_DTYPES = ("int64", "int32", "bool", *FLOAT_DTYPES)
EMBEDDING_OP = ATEN_PREFIX + "embedding.default"
VOCABULARY_FILE = "vocab.txt"          # the name an import gives the vocabulary beside the program
ReadFile = Callable[[str], bytes]      # a file of the model directory by its plain name, bounded


class SpecError(ValueError):
    """A spec that is malformed or disagrees with the program; ``field`` is the spec's path (``("input",
    "shape")``)."""

    def __init__(self, field: tuple[Any, ...], message: str):
        super().__init__(message)
        self.field = field


@dataclass
class ModelSpec:
    """A checked spec: the attributed input's kind, name, dtype and per-example shape (without the batch), its
    feature names (tabular) and mean; the class names."""

    kind: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    labels: list[str]
    features: list[str] | None = None
    mean: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    tokens: TokenSpec | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict[str, Any]:
        if self.tokens is not None:
            return {"input": {"name": self.name, "kind": self.kind, "dtype": self.dtype, **self.tokens.to_json()},
                    "labels": list(self.labels)}
        out: dict[str, Any] = {"input": {"name": self.name, "kind": self.kind, "dtype": self.dtype,
                                         "shape": ["batch", *self.shape]}, "labels": list(self.labels)}
        if self.features is not None:
            out["input"]["features"] = list(self.features)
        if self.mean is not None:
            out["input"]["mean"] = list(self.mean)
        return out


def _names(value: Any, n: int, field: tuple[Any, ...], what: str) -> list[str]:
    if not isinstance(value, list) or len(value) != n:
        raise SpecError(field, f"{what} must be a list of {n} names (got "
                        f"{len(value) if isinstance(value, list) else type(value).__name__})")
    for i, v in enumerate(value):
        if not isinstance(v, str) or not v or len(v) > MAX_NAME or not v.isprintable():
            raise SpecError((*field, i), f"{what}[{i}] must be a printable name of 1 to {MAX_NAME} characters")
    if len(set(value)) != n:
        raise SpecError(field, f"{what} has a name twice")
    return list(value)


def _program_input(info: ProgramInfo) -> TensorInfo:
    if len(info.inputs) != 1:
        raise SpecError(("input",), f"the program takes {len(info.inputs)} inputs "
                        f"({', '.join(i.name for i in info.inputs)}); the service attributes a program of one "
                        "input tensor: export a wrapper that takes one")
    x = info.inputs[0]
    if x.dtype not in FLOAT_DTYPES:
        raise SpecError(("input", "dtype"), f"the program's input {x.name!r} is {x.dtype}: Integrated Gradients "
                        "needs a floating-point input to differentiate; for token ids declare input.kind 'tokens' "
                        "and name the embedding table IG attributes over (input.embedding)")
    if not x.shape or x.shape[0] is not None:
        raise SpecError(("input", "shape"), f"the program's input {x.name!r} has shape {x.shown()}: its first "
                        "dimension must be a dynamic batch; export with dynamic_shapes={'" + x.name
                        + "': {0: torch.export.Dim('batch')}}")
    if any(d is None for d in x.shape[1:]):
        raise SpecError(("input", "shape"), f"the program's input {x.name!r} has shape {x.shown()}: only the batch "
                        "dimension may be dynamic")
    return x


def check_spec(spec: Any, info: ProgramInfo, read_file: ReadFile | None = None) -> ModelSpec:
    """The spec checked against the program; :class:`SpecError` naming the spec's field otherwise. ``read_file``
    reads a file the spec names (a token input's ``vocabulary``) from the model directory."""
    if not isinstance(spec, dict):
        raise SpecError((), "the spec must be a JSON object with input and labels")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise SpecError((unknown[0],), f"unknown spec field {unknown[0]!r} (a spec has {sorted(SPEC_KEYS)})")
    inp = spec.get("input")
    if not isinstance(inp, dict):
        raise SpecError(("input",), "spec.input must be an object with the input's kind (image or tabular)")
    kind = inp.get("kind")
    if kind not in KINDS:
        raise SpecError(("input", "kind"), f"input.kind must be one of {list(KINDS)}")
    keys = TOKEN_KEYS if kind == "tokens" else INPUT_KEYS
    unknown = sorted(set(inp) - keys)
    if unknown:
        raise SpecError(("input", unknown[0]), f"unknown input field {unknown[0]!r} (a {kind} input has "
                        f"{sorted(keys)})")
    if kind == "tokens":
        tokens, name = _check_tokens(inp, info, read_file)
        labels = _labels(spec, info)
        return ModelSpec(kind, name, "int64", (tokens.max_tokens,), labels, tokens=tokens)
    x = _program_input(info)
    shape = tuple(int(d) for d in x.shape[1:])  # type: ignore[arg-type]
    if "name" in inp and inp["name"] != x.name:
        raise SpecError(("input", "name"), f"the program's input is named {x.name!r}, not {str(inp['name'])[:80]!r}")
    if "dtype" in inp and inp["dtype"] != x.dtype:
        raise SpecError(("input", "dtype"), f"the program's input {x.name!r} is {x.dtype}, not "
                        f"{str(inp['dtype'])[:40]!r}")
    if "shape" in inp:
        given = inp["shape"]
        expected = ["batch", *shape]
        if given != expected:
            raise SpecError(("input", "shape"), f"the program's input {x.name!r} has shape {x.shown()}, not "
                            f"{str(given)[:80]}")
    if math.prod(shape) > MAX_INPUT_VALUES:
        raise SpecError(("input", "shape"), f"one input has {math.prod(shape):,} values; the service attributes "
                        f"inputs of up to {MAX_INPUT_VALUES:,}")
    features = None
    if kind == "image":
        if len(shape) != 3 or not 1 <= shape[0] <= MAX_CHANNELS:
            raise SpecError(("input", "kind"), f"an image input is [batch, channels, height, width] with 1 to "
                            f"{MAX_CHANNELS} channels; the program's is {x.shown()}")
        if "features" in inp:
            raise SpecError(("input", "features"), "features name the columns of a tabular input")
        width = shape[0]
    else:
        if len(shape) != 1:
            raise SpecError(("input", "kind"), f"a tabular input is [batch, features]; the program's is {x.shown()}")
        width = shape[0]
        features = _names(inp["features"], width, ("input", "features"), "features") if "features" in inp \
            else [f"x{i}" for i in range(width)]
    mean = None
    if "mean" in inp:
        m = inp["mean"]
        what = "channel" if kind == "image" else "feature"
        if not isinstance(m, list) or len(m) != width or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in m):
            raise SpecError(("input", "mean"), f"mean must be {width} finite numbers, one per {what}")
        mean = [float(v) for v in m]
    return ModelSpec(kind, x.name, x.dtype, shape, _labels(spec, info), features, mean)


def _labels(spec: dict[str, Any], info: ProgramInfo) -> list[str]:
    """The class names, one per logit of the program's one output ``[batch, classes]``."""
    if len(info.outputs) != 1:
        raise SpecError(("labels",), f"the program gives {len(info.outputs)} outputs; the service explains a "
                        "program whose one output is the logits [batch, classes]")
    y = info.outputs[0]
    if len(y.shape) != 2 or y.shape[0] is not None or y.shape[1] is None or y.dtype not in FLOAT_DTYPES:
        raise SpecError(("labels",), f"the program's output {y.name!r} is {y.dtype} {y.shown()}; the service "
                        "explains logits of shape [batch, classes]")
    n = int(y.shape[1])
    if n > MAX_LABELS:
        raise SpecError(("labels",), f"the program gives {n} logits; the most the service names is {MAX_LABELS}")
    return _names(spec["labels"], n, ("labels",), "labels") if "labels" in spec else [str(i) for i in range(n)]


# ------------------------------------------------------------------------------------------------ token inputs
@dataclass
class TokenSpec:
    """A checked token input: the embedding table IG attributes over (its name in the model, its graph input, the
    embedding call whose output is replaced, its rows and width), the sequence length (static, or dynamic from
    ``min_tokens`` to ``max_tokens``), the baselines' tokens, the vocabulary's lines and the attention mask's
    program input (None: the program takes none)."""

    embedding: str
    table: str
    node: str
    vocab_size: int
    dim: int
    max_tokens: int
    min_tokens: int
    dynamic: bool
    inputs: list[str]                       # the program's user inputs, in call order
    pad_id: int | None = None
    mask_id: int | None = None
    special_ids: list[int] = field(default_factory=list)
    words: list[str] | None = None          # the vocabulary, line i naming id i
    attention_mask: str | None = None
    mask_dtype: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shape": ["batch", "tokens" if self.dynamic else self.max_tokens],
                               "embedding": self.embedding, "vocab_size": self.vocab_size,
                               "max_tokens": self.max_tokens}
        if self.dynamic:
            out["min_tokens"] = self.min_tokens
        for key in ("pad_id", "mask_id", "attention_mask"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.special_ids:
            out["special_ids"] = list(self.special_ids)
        if self.words is not None:
            out["vocabulary"] = VOCABULARY_FILE
        return out


_SYMBOL = re.compile(r"^Symbol\('([A-Za-z_][A-Za-z0-9_]{0,40})'")


def _bounds(info: ProgramInfo, name: str, dim: int) -> tuple[int, int | None]:
    """(min, max) of a dynamic size as the program's range constraints record it: the symbol's name is read from
    the serialized expression with a pattern (nothing is evaluated); ``(1, None)`` when it cannot be read."""
    meta = info.program["graph_module"]["graph"]["tensor_values"].get(name) or {}
    try:
        expr = meta["sizes"][dim]["as_expr"]["expr_str"]
    except (KeyError, IndexError, TypeError):
        return 1, None
    m = _SYMBOL.match(expr) if isinstance(expr, str) else None
    constraints = info.program.get("range_constraints")
    rc = constraints.get(m.group(1)) if m and isinstance(constraints, dict) else None
    if not isinstance(rc, dict):
        return 1, None
    lo, hi = rc.get("min_val"), rc.get("max_val")
    lo = lo if isinstance(lo, int) and not isinstance(lo, bool) and lo >= 1 else 1
    hi = hi if isinstance(hi, int) and not isinstance(hi, bool) and hi >= lo else None
    return lo, hi


def _arg_tensor(node: dict[str, Any], name: str, position: int) -> str | None:
    """The tensor value a node passes as its argument ``name`` (or at ``position``), or None."""
    args = node.get("inputs") or []
    found = next((a for a in args if a.get("name") == name), args[position] if position < len(args) else None)
    arg = found.get("arg") if isinstance(found, dict) else None
    name = arg["as_tensor"].get("name") if isinstance(arg, dict) and isinstance(arg.get("as_tensor"), dict) else None
    return name if isinstance(name, str) else None


def output_name(node: dict[str, Any]) -> str | None:
    """The name of a node's one tensor output (None for a node of no or several outputs)."""
    outs = node.get("outputs") or []
    t = outs[0].get("as_tensor") if len(outs) == 1 and isinstance(outs[0], dict) else None
    name = t.get("name") if isinstance(t, dict) else None
    return name if isinstance(name, str) else None


def embedding_calls(info: ProgramInfo) -> list[tuple[str, str | None, str | None]]:
    """Every ``aten.embedding.default`` call of the graph: (its output value, the table's graph input, the
    indices' value)."""
    out = []
    for node in info.program["graph_module"]["graph"]["nodes"]:
        if node.get("target") != EMBEDDING_OP:
            continue
        out.append((str(output_name(node)), _arg_tensor(node, "weight", 0), _arg_tensor(node, "indices", 1)))
    return out


def embedding_node(info: ProgramInfo, fqn: str, ids: str) -> tuple[str, str]:
    """The graph input that holds the model's tensor ``fqn`` and the output of the one embedding call that reads
    it with the input ``ids`` as its indices; :class:`SpecError` on ``input.embedding`` saying what the graph has
    otherwise."""
    by_fqn = {f: name for name, (_, f) in info.state.items()}
    calls = embedding_calls(info)
    fqn_of = {name: f for name, (_, f) in info.state.items()}

    def described() -> str:
        if not calls:
            return "the graph calls no aten.embedding.default"
        users = {x.name for x in info.inputs}
        shown = [f"{fqn_of.get(w, w)!r} with indices {'input' if i in users else 'the computed value'} {i!r}"
                 for _, w, i in calls[:10]]
        return "the graph's embedding calls read " + "; ".join(shown)

    table = by_fqn.get(fqn)
    if table is None:
        raise SpecError(("input", "embedding"), f"the program has no parameter or buffer {fqn[:MAX_NAME]!r}; "
                        f"{described()}")
    mine = [value for value, w, i in calls if w == table and i == ids]
    if len(mine) != 1:
        what = "is not read by an aten.embedding.default call" if not any(w == table for _, w, _ in calls) else \
            f"is not the table of an embedding call whose indices are the input {ids!r}" if not mine else \
            f"is read with the input {ids!r} by {len(mine)} embedding calls (the service replaces one)"
        raise SpecError(("input", "embedding"), f"{fqn[:MAX_NAME]!r} {what}; {described()}")
    return table, mine[0]


def _token_id(value: Any, vocab: int, at: tuple[Any, ...], what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise SpecError(at, f"{what} must be a token id in 0..{vocab - 1} (the embedding table's rows)")
    return value


def _vocabulary(name: Any, read_file: ReadFile | None, vocab: int) -> list[str]:
    at = ("input", "vocabulary")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or "/" in name or "\\" in name \
            or name in (".", "..") or not name.isprintable():
        raise SpecError(at, "vocabulary must be the plain name of a file in the model directory (vocab.txt)")
    if read_file is None:
        raise SpecError(at, "the vocabulary is a file of the model directory: give the spec as the directory's "
                        "spec.json or as the import's config")
    raw = read_file(name)
    if len(raw) > MAX_VOCABULARY_BYTES:
        raise SpecError(at, f"{name} has more than {MAX_VOCABULARY_BYTES} bytes")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SpecError(at, f"{name} is not UTF-8 text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.removesuffix("\r") for line in lines]
    if len(lines) != vocab:
        raise SpecError(at, f"{name} has {len(lines)} lines; the embedding table has {vocab} rows (one token per "
                        "line, line i naming id i)")
    for i, w in enumerate(lines):
        if not w or len(w) > MAX_TOKEN_CHARS or not w.isprintable():
            raise SpecError(at, f"{name}: line {i + 1} must be a printable token of 1 to {MAX_TOKEN_CHARS} "
                            "characters")
    return lines


def _check_tokens(inp: dict[str, Any], info: ProgramInfo, read_file: ReadFile | None) -> tuple[TokenSpec, str]:
    """A token input checked against the program: (its checked spec, the ids input's name)."""
    names = [i.name for i in info.inputs]
    by_name = {i.name: i for i in info.inputs}
    mask_name = inp.get("attention_mask")
    if mask_name is not None and (not isinstance(mask_name, str) or mask_name not in by_name):
        raise SpecError(("input", "attention_mask"), f"the program has no input {str(mask_name)[:80]!r} (its "
                        f"inputs: {', '.join(names)})")
    wanted = 2 if mask_name is not None else 1
    if len(names) != wanted:
        raise SpecError(("input", "attention_mask") if len(names) == 2 else ("input",),
                        f"the program takes {len(names)} inputs ({', '.join(names)}); a token program takes the "
                        "ids and, declared as input.attention_mask, an attention mask")
    rest = [n for n in names if n != mask_name]
    if "name" in inp and inp["name"] != rest[0]:
        raise SpecError(("input", "name"), f"the program's ids input is named {rest[0]!r}, not "
                        f"{str(inp['name'])[:80]!r}")
    x = by_name[rest[0]]
    if x.dtype != "int64":
        raise SpecError(("input", "dtype"), f"the program's input {x.name!r} is {x.dtype}: token ids are int64")
    if "dtype" in inp and inp["dtype"] != "int64":
        raise SpecError(("input", "dtype"), "a token input's dtype is int64")
    if len(x.shape) != 2 or x.shape[0] is not None:
        raise SpecError(("input", "shape"), f"the program's input {x.name!r} has shape {x.shown()}: token ids are "
                        "[batch, tokens] with a dynamic batch")
    dynamic = x.shape[1] is None
    if "shape" in inp and inp["shape"] != ["batch", "tokens" if dynamic else x.shape[1]]:
        raise SpecError(("input", "shape"), f"the program's input {x.name!r} has shape "
                        f"{'[batch, tokens]' if dynamic else x.shown()}, not {str(inp['shape'])[:80]}")
    given_max = inp.get("max_tokens")
    if given_max is not None and (isinstance(given_max, bool) or not isinstance(given_max, int)
                                  or not 1 <= given_max <= MAX_TOKENS):
        raise SpecError(("input", "max_tokens"), f"max_tokens must be an integer in 1..{MAX_TOKENS}")
    if dynamic:
        lo, hi = _bounds(info, x.name, 1)
        if given_max is None and (hi is None or hi > MAX_TOKENS):
            raise SpecError(("input", "max_tokens"), f"the program's sequence length is dynamic (up to "
                            f"{hi if hi is not None else 'unbounded'}): give max_tokens, at most {MAX_TOKENS}")
        max_tokens = given_max if given_max is not None else hi
        if hi is not None and max_tokens > hi or max_tokens < lo:
            raise SpecError(("input", "max_tokens"), f"max_tokens is {max_tokens}; the program was exported for "
                            f"{lo} to {hi if hi is not None else 'any number of'} tokens")
    else:
        lo = max_tokens = int(x.shape[1])  # type: ignore[arg-type]
        if max_tokens > MAX_TOKENS:
            raise SpecError(("input", "shape"), f"the program reads {max_tokens} tokens; the service attributes at "
                            f"most {MAX_TOKENS}")
        if given_max is not None and given_max != max_tokens:
            raise SpecError(("input", "max_tokens"), f"the program reads exactly {max_tokens} tokens")
    if "min_tokens" in inp and inp["min_tokens"] != lo:
        raise SpecError(("input", "min_tokens"), f"the program reads at least {lo} tokens")
    mask_dtype = None
    if mask_name is not None:
        m = by_name[mask_name]
        if m.dtype not in MASK_DTYPES or len(m.shape) != 2 or m.shape[0] is not None \
                or (m.shape[1] is None) != dynamic or (not dynamic and m.shape[1] != x.shape[1]):
            raise SpecError(("input", "attention_mask"), f"the program's input {mask_name!r} is {m.dtype} "
                            f"{m.shown()}; an attention mask has the ids' shape {x.shown()} (int, bool or float)")
        mask_dtype = m.dtype
    fqn = inp.get("embedding")
    if not isinstance(fqn, str) or not fqn:
        raise SpecError(("input", "embedding"), "a token input names its embedding table (input.embedding: the "
                        "parameter the ids index, such as 'embed.weight')")
    table, node = embedding_node(info, fqn, x.name)
    payload = info.weights.get(fqn) or info.constants.get(fqn)
    if payload is None or len(payload.sizes) != 2 or payload.dtype not in FLOAT_DTYPES:
        raise SpecError(("input", "embedding"), f"{fqn[:MAX_NAME]!r} is not a stored 2-D floating-point table")
    vocab, dim = payload.sizes
    if not 2 <= vocab <= MAX_VOCABULARY or dim < 1:
        raise SpecError(("input", "embedding"), f"{fqn[:MAX_NAME]!r} has {vocab} rows; the service takes tables "
                        f"of 2 to {MAX_VOCABULARY} tokens")
    if "vocab_size" in inp and inp["vocab_size"] != vocab:
        raise SpecError(("input", "vocab_size"), f"the embedding table {fqn[:MAX_NAME]!r} has {vocab} rows")
    ids = {k: _token_id(inp[k], vocab, ("input", k), k) for k in ("pad_id", "mask_id") if inp.get(k) is not None}
    special = inp.get("special_ids", [])
    if not isinstance(special, list) or len(special) > MAX_SPECIAL_IDS:
        raise SpecError(("input", "special_ids"), f"special_ids must be a list of at most {MAX_SPECIAL_IDS} ids")
    special = sorted({_token_id(v, vocab, ("input", "special_ids", i), f"special_ids[{i}]")
                      for i, v in enumerate(special)})
    if mask_name is not None and "pad_id" not in ids:
        raise SpecError(("input", "pad_id"), "with an attention mask, give pad_id: the mask is 0 where the ids "
                        "hold it")
    words = _vocabulary(inp["vocabulary"], read_file, vocab) if "vocabulary" in inp else None
    return TokenSpec(fqn, table, node, vocab, dim, max_tokens, lo, dynamic, names, ids.get("pad_id"),
                     ids.get("mask_id"), special, words, mask_name, mask_dtype), x.name
