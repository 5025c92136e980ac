r"""TracIn's gradient dot products factorised for linear layers ("ghost" dot products; Goodfellow 2015, and TracIn's
own appendix): exact, without materialising a linear layer's per-example gradient where that costs more.

For an ``nn.Linear`` layer with input rows ``a_t`` (bias: a 1 appended) and output gradients ``δ_t`` over the
positions ``t`` of one example (one position for a flat input, the tokens of a text), the weight gradient is
``Σ_t δ_t a_tᵀ``, so the dot product of two examples' gradients is

.. math::

    \langle \nabla_W \ell(z), \nabla_W \ell(z') \rangle = \sum_{t, s} (a_t \cdot a'_s)(\delta_t \cdot \delta'_s)

which needs ``T·(d_in + 1 + d_out)`` numbers per example instead of ``(d_in + 1)·d_out`` and ``T·T'·(d_in + 1 +
d_out)`` operations per pair instead of ``(d_in + 1)·d_out``. :class:`GhostGradients` takes that form for every
linear layer where it pays (``T·T·(d_in + 1 + d_out) < (d_in + 1)·d_out``, decided on the first batch and then
fixed), and materialises the per-example gradients of every other parameter (convolutions, embeddings,
normalisations, and linear layers where the factors would cost more) with ``torch.func`` as
:class:`models.explain.tracin.FuncGradients` does; the dot products add up. The activations and output gradients
come from one batched forward and backward of the summed per-example outputs, which gives each example's own
output gradients when the examples of a batch do not interact (a model in eval mode): checked on the first batch
(each row's output alone equals its output in the batch); a model that fails the check is run without the factors
(all materialised), with a warning.

A model without ``nn.Linear`` modules (an exported program) is seen through the classifier's ``layered`` view
(its linear calls as real modules); a Hugging Face ``Conv1D`` is an ``nn.Linear`` there too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from models.explain.classifier import Classifier
from models.explain.gradients import LossFn, per_example_gradients
from models.explain.tracin import CheckpointLike, GradientModel

BatchOutput = Callable[[nn.Module, torch.Tensor], torch.Tensor]  # (module, rows [B, ...]) -> per-row values [B]


def pays(positions: int, d_in: int, d_out: int) -> bool:
    """Whether the factors of a linear layer (``positions`` rows per example, ``d_in`` with the bias' 1) cost fewer
    operations per pair than its materialised gradient."""
    return positions * positions * (d_in + d_out) < d_in * d_out


class GhostGradients(GradientModel):
    """A :class:`GradientModel` of a :class:`Classifier` with factorised linear layers (module docstring).

    ``output``: the per-row function differentiated, as a :data:`LossFn` (for the materialised parameters) and
    ``batch_output`` (the same for a batch of rows, ``[B]``: the ghost pass sums it); ``ghost``: ``"auto"`` (where
    it pays), ``"all"`` (every linear layer, for tests) or ``"none"``.
    """

    def __init__(self, clf: Classifier, output: LossFn, batch_output: BatchOutput, *, ghost: str = "auto",
                 device: torch.device | str | None = None, batch_size: int = 256) -> None:
        if ghost not in ("auto", "all", "none"):
            raise ValueError(f"ghost must be 'auto', 'all' or 'none', got {ghost!r}")
        self.clf, self.output, self.batch_output, self.ghost = clf, output, batch_output, ghost
        self.batch_size = max(1, int(batch_size))
        self.device = torch.device(device) if device is not None else next(iter(clf.module.parameters())).device
        self.dtype = torch.float32
        self.warnings: list[str] = []
        self._split: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # (ghost layers, materialised params)
        self._current: nn.Module | None = None
        if not clf.checkpoints:
            raise ValueError("no checkpoints")
        work = self.view(clf.checkpoints[0])
        self.names = tuple(n for n, _ in work.named_parameters())
        self._width = sum(p.numel() for p in work.parameters())

    # -- weights ---------------------------------------------------------------------------------------------------
    def view(self, ckpt: CheckpointLike) -> nn.Module:
        """The module at ``ckpt`` as real linear layers (the classifier's ``layered`` view; the module itself when
        it has none)."""
        module = self.clf.at(ckpt, self.device)
        return self.clf.layered(module).eval() if self.clf.layered is not None else module

    def load(self, ckpt: CheckpointLike) -> None:
        self._current = self.view(ckpt)

    def snapshot(self, ckpt: CheckpointLike) -> nn.Module:
        return self.view(ckpt)

    def state(self, weights: nn.Module) -> dict[str, torch.Tensor]:
        return weights.state_dict()

    # -- features ------------------------------------------------------------------------------------------------
    def _linears(self, module: nn.Module) -> dict[str, nn.Linear]:
        return {n: m for n, m in module.named_modules() if isinstance(m, nn.Linear)}

    def _ghost_pass(self, module: nn.Module, rows: torch.Tensor, layers: Sequence[str]
                    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per layer ``(A [B, T, d_in(+1)], D [B, T, d_out])`` of ``rows`` (every call of the layer: positions)."""
        linears = self._linears(module)
        seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {n: [] for n in layers}
        handles = []

        def hook(name: str) -> Callable[..., None]:
            def record(mod: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
                seen[name].append((args[0].detach(), out))
            return record

        for name in layers:
            handles.append(linears[name].register_forward_hook(hook(name)))
        params = [p for p in module.parameters()]
        for p in params:
            p.requires_grad_(True)
        try:
            with torch.enable_grad():
                total = self.batch_output(module, rows).sum()
                outs = [o for name in layers for _, o in seen[name]]
                grads = torch.autograd.grad(total, outs, allow_unused=True) if outs else ()
        finally:
            for h in handles:
                h.remove()
            for p in params:
                p.requires_grad_(False)
        it = iter(grads)
        b = len(rows)
        out = {}
        for name in layers:
            a_parts, d_parts = [], []
            for a, o in seen[name]:
                g = next(it)
                g = torch.zeros_like(o) if g is None else g
                a = a.reshape(b, -1, a.shape[-1]).float()
                if linears[name].bias is not None:
                    a = torch.cat([a, a.new_ones(*a.shape[:-1], 1)], -1)
                a_parts.append(a)
                d_parts.append(g.detach().reshape(b, -1, g.shape[-1]).float())
            out[name] = (torch.cat(a_parts, 1), torch.cat(d_parts, 1))
        return out

    def _decide(self, module: nn.Module, rows: torch.Tensor) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Which linear layers take the factors (fixed from the first batch on), and the parameters materialised."""
        linears = self._linears(module)
        chosen: list[str] = []
        if self.ghost != "none" and linears and self._independent(module, rows):
            factors = self._ghost_pass(module, rows[:1], list(linears))
            for name, (a, d) in factors.items():
                if self.ghost == "all" or pays(a.shape[1], a.shape[2], d.shape[2]):
                    chosen.append(name)
        covered = {f"{n}.{p}" for n in chosen for p in ("weight", "bias")}
        rest = tuple(n for n, _ in module.named_parameters() if n not in covered)
        return tuple(chosen), rest

    def _independent(self, module: nn.Module, rows: torch.Tensor) -> bool:
        """Each of the first rows' outputs alone equals its output in the batch (no interaction within a batch)."""
        probe = rows[:4]
        if len(probe) < 2:
            return True
        with torch.no_grad():
            together = self.batch_output(module, probe)
            alone = torch.cat([self.batch_output(module, probe[i:i + 1]) for i in range(len(probe))])
        if torch.allclose(together, alone, rtol=1e-4, atol=1e-5):
            return True
        self.warnings.append("the examples of a batch interact in this model (an output changes with the other "
                             "rows of its batch), so TracIn materialised every gradient instead of factorising "
                             "the linear layers")
        return False

    def features(self, examples: torch.Tensor, weights: nn.Module | None = None) -> dict[str, Any]:
        module = self._current if weights is None else weights
        assert module is not None, "load a checkpoint first"
        examples = examples.to(self.device)
        if self._split is None:
            self._split = self._decide(module, examples)
        layers, rest = self._split
        parts: dict[str, list[Any]] = {"ghost": [], "dense": []}
        for i in range(0, len(examples), self.batch_size):
            b = examples[i:i + self.batch_size]
            parts["ghost"].append(self._ghost_pass(module, b, layers) if layers else {})
            parts["dense"].append(per_example_gradients(module, rest, self.output, b).float() if rest
                                  else torch.zeros(len(b), 0, device=self.device))
        ghost = {n: (torch.cat([p[n][0] for p in parts["ghost"]]), torch.cat([p[n][1] for p in parts["ghost"]]))
                 for n in layers}
        dense = torch.cat(parts["dense"]) if parts["dense"] else torch.zeros(0, 0, device=self.device)
        return {"ghost": ghost, "dense": dense}

    def dots(self, fa: dict[str, Any], fb: dict[str, Any], n: int, m: int) -> torch.Tensor:
        out = fa["dense"] @ fb["dense"].t() if fa["dense"].shape[1] else torch.zeros(n, m, device=self.device)
        for name, (a1, d1) in fa["ghost"].items():
            a2, d2 = fb["ghost"][name]
            if a1.shape[1] == 1 and a2.shape[1] == 1:
                out = out + (a1[:, 0] @ a2[:, 0].t()) * (d1[:, 0] @ d2[:, 0].t())
            else:
                out = out + torch.einsum("nti,msi,nto,mso->nm", a1, a2, d1, d2)
        return out

    def self_dots(self, fa: dict[str, Any], n: int) -> torch.Tensor:
        out = (fa["dense"] * fa["dense"]).sum(1) if fa["dense"].shape[1] else torch.zeros(n, device=self.device)
        for a, d in fa["ghost"].values():
            if a.shape[1] == 1:
                out = out + (a[:, 0] * a[:, 0]).sum(1) * (d[:, 0] * d[:, 0]).sum(1)
            else:
                out = out + torch.einsum("nti,nsi,nto,nso->n", a, a, d, d)
        return out

    def bytes_per_example(self) -> int:
        return 4 * self._width  # at most what materialised gradients take (the factors take less where chosen)

    def fingerprint(self) -> str:
        return repr(("ghost", self.names, self.output, self.ghost, str(self.device)))

    def plan(self, examples: torch.Tensor) -> tuple[str, ...]:
        """Fix which linear layers take the factors from ``examples`` (at the first checkpoint, unless one is
        loaded) without computing features; returns :attr:`factorised`."""
        if self._split is None:
            module = self._current if self._current is not None else self.view(self.clf.checkpoints[0])
            self._split = self._decide(module, examples.to(self.device))
        return self.factorised

    @property
    def factorised(self) -> tuple[str, ...]:
        """The linear layers that took the factors (empty before the first batch)."""
        return self._split[0] if self._split is not None else ()
