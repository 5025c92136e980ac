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

The program must take exactly one tensor input, floating point (IG differentiates with respect to it), with a
dynamic batch dimension and every other dimension static. An integer input (token ids) would need an embedding
table to attribute over: such a model is imported as a Hugging Face checkpoint, or exported from its embeddings
on (``inputs_embeds``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from models.export.files import FLOAT_DTYPES, ProgramInfo, TensorInfo

KINDS = ("image", "tabular")
MAX_CHANNELS = 16
MAX_INPUT_VALUES = 3 * 512 * 512      # one input's elements (a 512x512 RGB image)
MAX_LABELS = 10_000
MAX_NAME = 200
SPEC_KEYS = {"input", "labels"}
INPUT_KEYS = {"name", "kind", "shape", "dtype", "features", "mean"}


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

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict[str, Any]:
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
                        "needs a floating-point input to differentiate; token ids would need an embedding table "
                        "(import the model as a Hugging Face checkpoint, or export it from the embedding output on)")
    if not x.shape or x.shape[0] is not None:
        raise SpecError(("input", "shape"), f"the program's input {x.name!r} has shape {x.shown()}: its first "
                        "dimension must be a dynamic batch; export with dynamic_shapes={'" + x.name
                        + "': {0: torch.export.Dim('batch')}}")
    if any(d is None for d in x.shape[1:]):
        raise SpecError(("input", "shape"), f"the program's input {x.name!r} has shape {x.shown()}: only the batch "
                        "dimension may be dynamic")
    return x


def check_spec(spec: Any, info: ProgramInfo) -> ModelSpec:
    """The spec checked against the program; :class:`SpecError` naming the spec's field otherwise."""
    if not isinstance(spec, dict):
        raise SpecError((), "the spec must be a JSON object with input and labels")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise SpecError((unknown[0],), f"unknown spec field {unknown[0]!r} (a spec has {sorted(SPEC_KEYS)})")
    inp = spec.get("input")
    if not isinstance(inp, dict):
        raise SpecError(("input",), "spec.input must be an object with the input's kind (image or tabular)")
    unknown = sorted(set(inp) - INPUT_KEYS)
    if unknown:
        raise SpecError(("input", unknown[0]), f"unknown input field {unknown[0]!r} (an input has "
                        f"{sorted(INPUT_KEYS)})")
    kind = inp.get("kind")
    if kind not in KINDS:
        raise SpecError(("input", "kind"), f"input.kind must be one of {list(KINDS)}")
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
    labels = _names(spec["labels"], n, ("labels",), "labels") if "labels" in spec else [str(i) for i in range(n)]
    return ModelSpec(kind, x.name, x.dtype, shape, labels, features, mean)
