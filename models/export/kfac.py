"""Which layers of an exported program influence functions with EK-FAC can cover (no torch: the API asks it).

Kronfluence (the library ``POST /tracin/classifier`` runs EK-FAC with) approximates the Hessian layer by layer for
``nn.Linear`` and ``nn.Conv2d`` modules: it hooks their inputs and output gradients. An exported program has no
modules, only ATen calls, so the service gives it some: every call of ``aten.linear`` or ``aten.conv2d`` (the
operators ``torch.export.export`` leaves for ``nn.Linear`` and ``nn.Conv2d``) whose weight, and bias if any, are
parameters of the program that no other call uses, and whose convolution settings are plain numbers, becomes a
real module holding those parameters (``models.export.influence.LayeredProgram``); Kronfluence then covers those
parameters. Everything else the program computes with (normalisations, embeddings, a weight shared by two calls, a
``matmul`` with a parameter, the ``addmm``/``convolution`` calls of a program decomposed to core ATen by
``run_decompositions``) stays as it runs and is outside the EK-FAC scores, as it is outside Kronfluence's for an
eager model. A program with no such call cannot have EK-FAC scores: :func:`program_layers` says why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from models.export.files import ProgramInfo

LINEAR = "torch.ops.aten.linear.default"
CONV2D = "torch.ops.aten.conv2d.default"
CONV_DEFAULTS = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1}
CONV_ORDER = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
WHY_NONE = ("EK-FAC (Kronfluence) covers nn.Linear and nn.Conv2d layers; the program has no aten.linear or "
            "aten.conv2d call whose weight is a parameter of its own (a program decomposed to core ATen calls "
            "addmm/convolution instead: export it with torch.export.export and save it without "
            "run_decompositions)")


@dataclass(frozen=True)
class Layer:
    """One call the service runs as a real module: the node's name, ``linear`` or ``conv2d``, the parameters'
    fully qualified names, and a convolution's settings."""

    node: str
    kind: str
    weight: str
    bias: str | None
    conv: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The module's name: the weight's owner (``conv1.weight`` -> ``conv1``)."""
        return self.weight.rsplit(".", 1)[0] if "." in self.weight else self.weight


def _tensor_name(arg: dict[str, Any]) -> str | None:
    t = arg.get("as_tensor")
    return t.get("name") if isinstance(t, dict) else None


def _ints(arg: dict[str, Any], n: int) -> list[int] | None:
    v = arg.get("as_ints", arg.get("as_int"))
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v] * n
    if isinstance(v, list) and len(v) == 1:
        v = v * n
    return v if isinstance(v, list) and len(v) == n and all(isinstance(i, int) and not isinstance(i, bool)
                                                             for i in v) else None


def _conv_settings(node: dict[str, Any]) -> dict[str, Any] | None:
    """The node's stride, padding, dilation and groups as numbers (defaults where it leaves them out), or None
    when one is not a plain number (``padding='same'``, a symbolic size)."""
    out = dict(CONV_DEFAULTS)
    for i, a in enumerate(node.get("inputs") or []):
        name = a.get("name") or (CONV_ORDER[i] if i < len(CONV_ORDER) else None)
        arg = a.get("arg") or {}
        if name in ("stride", "padding", "dilation"):
            v = _ints(arg, 2)
            if v is None:
                return None
            out[name] = v
        elif name == "groups":
            g = arg.get("as_int")
            if not isinstance(g, int) or isinstance(g, bool) or g < 1:
                return None
            out["groups"] = g
    return out


def program_layers(info: ProgramInfo) -> list[Layer]:
    """The calls of the program the service runs as ``nn.Linear`` / ``nn.Conv2d`` for EK-FAC (module docstring), in
    graph order."""
    nodes = info.program["graph_module"]["graph"]["nodes"]
    uses: Counter[str] = Counter()
    for n in nodes:
        for a in n.get("inputs") or []:
            arg = a.get("arg") or {}
            name = _tensor_name(arg)
            if name is not None:
                uses[name] += 1
            for t in arg.get("as_tensors") or []:
                if isinstance(t, dict) and t.get("name"):
                    uses[t["name"]] += 1
    params = {name: fqn for name, (kind, fqn) in info.state.items() if kind == "parameter"}
    out = []
    for n in nodes:
        target = n.get("target")
        if target not in (LINEAR, CONV2D):
            continue
        args = {a.get("name"): a.get("arg") or {} for a in n.get("inputs") or []}
        weight = _tensor_name(args.get("weight", {}))
        bias_arg = args.get("bias", {"as_none": True})
        if "as_optional_tensor" in bias_arg:
            bias_arg = bias_arg["as_optional_tensor"]
        bias = _tensor_name(bias_arg)
        if weight not in params or uses[weight] != 1 or (bias is None and "as_none" not in bias_arg):
            continue
        if bias is not None and (bias not in params or uses[bias] != 1):
            continue
        conv: dict[str, Any] = {}
        if target == CONV2D:
            settings = _conv_settings(n)
            if settings is None:
                continue
            conv = settings
        out.append(Layer(str(n.get("name")), "linear" if target == LINEAR else "conv2d", params[weight],
                         params[bias] if bias is not None else None, conv))
    return out


def layers_problem(info: ProgramInfo) -> str | None:
    """Why EK-FAC cannot run on the program (:data:`WHY_NONE`), or None when some layer can be covered."""
    return None if program_layers(info) else WHY_NONE
