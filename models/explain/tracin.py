r"""TracIn-CP, model-agnostic (Pruthi et al. 2020, "Estimating Training Data Influence by Tracing Gradient Descent").

.. math::

    \mathrm{TracIn}(z, z') = \sum_{i \in \text{checkpoints}} \eta_i \,
        \langle \nabla_w \ell(w_i, z), \nabla_w \ell(w_i, z') \rangle

with ``ℓ`` a model family's per-example loss, the gradient restricted to the parameters the family names, and
``η_i`` the weight of checkpoint ``i``.

The engine (:class:`TracIn`) never sees a model. A model family supplies a :class:`GradientModel`, the role
TRAK's ``AbstractModelOutput`` and gradient computers play: for the weights of one checkpoint it turns a batch of
examples (rows of a tensor) into gradient *features*, and gives the pairwise and self dot products of two such
features. The features may be the materialised per-example gradients (:class:`FuncGradients`: any ``nn.Module``
with a per-example loss, by ``torch.func``, :mod:`models.explain.gradients`), or any form whose products give the
same numbers without materialising them (ConvE's factored "ghost" form, :mod:`models.kg.tracin`). A family with a
fast path is tested equal to :class:`FuncGradients` on the same model.

What the engine adds: the sum over checkpoints, dense scores (:meth:`TracIn.influence`), self-influence
(:meth:`TracIn.self_influence`), and the streaming pass (:meth:`TracIn.top_influence`): the top-``k`` proponents
and opponents of each test example in memory that does not grow with test × train (training examples in chunks,
the test side's features computed once per checkpoint and block of test examples and kept, a running top-k per
test example, optional per-row candidate sets (:class:`CandidatePairs`) and a cache of the test side across calls
keyed by :meth:`TracIn.factor_key`). Non-finite scores raise :class:`NonFiniteScores` naming rows and columns.

Checkpoint weights η_i: by default the learning rate stored with the checkpoint (the rate of the last epoch of
its interval). ``weights`` replaces them, e.g. with :func:`interval_weights` (see there).
"""

from __future__ import annotations

import copy
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from models.explain.gradients import (
    LossFn,
    module_device,
    parameter_count,
    per_example_gradients,
    resolve_parameters,
)


class CheckpointLike(Protocol):
    """What the engines read of a checkpoint: its name, its learning rate (the default TracIn weight) and its
    weights."""

    lr: float

    @property
    def name(self) -> str: ...

    def state_dict(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]: ...


@dataclass
class MemoryCheckpoint:
    """A checkpoint held in memory (tests, benchmarks)."""

    state: dict[str, torch.Tensor]
    lr: float
    label: str = "memory"

    @property
    def name(self) -> str:
        return self.label

    def state_dict(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return {k: v.to(device) for k, v in self.state.items()}


# ------------------------------------------------------------------------------------------ the interface
class GradientModel(ABC):
    """A model family's per-example loss gradients, as TracIn-CP consumes them.

    At the weights made current by :meth:`load` (or held by a :meth:`snapshot`), :meth:`features` turns a batch of
    examples ``[n, ...]`` into gradient features of any form, and :meth:`dots` / :meth:`self_dots` give the exact
    gradient dot products ⟨∇ℓ(z_i), ∇ℓ(z'_j)⟩ from them, in ``dtype`` on ``device``.

    ``names``: the parameters differentiated (what a report lists as its layers). ``warnings``: what a request
    should be told about how it ran (a precision substituted, say).
    """

    names: tuple[str, ...]
    device: torch.device
    dtype: torch.dtype = torch.float32
    warnings: list[str]

    @abstractmethod
    def load(self, ckpt: CheckpointLike) -> None:
        """Make ``ckpt``'s weights current (what :meth:`features` uses when given no ``weights``)."""

    @abstractmethod
    def snapshot(self, ckpt: CheckpointLike) -> Any:
        """``ckpt``'s weights held apart from the current ones (the streaming pass keeps one per checkpoint)."""

    @abstractmethod
    def state(self, weights: Any) -> Mapping[str, torch.Tensor]:
        """The tensors of a :meth:`snapshot` (what :meth:`TracIn.factor_key` digests)."""

    @abstractmethod
    def features(self, examples: torch.Tensor, weights: Any = None) -> Any:
        """Gradient features of ``examples`` at ``weights`` (a :meth:`snapshot`; default: the current weights)."""

    @abstractmethod
    def dots(self, fa: Any, fb: Any, n: int, m: int) -> torch.Tensor:
        """``[n, m]``: the gradient dot products of the ``n`` examples of ``fa`` with the ``m`` of ``fb``."""

    @abstractmethod
    def self_dots(self, fa: Any, n: int) -> torch.Tensor:
        """``[n]``: ⟨∇ℓ(z_i), ∇ℓ(z_i)⟩ for the ``n`` examples of ``fa``."""

    @abstractmethod
    def bytes_per_example(self) -> int:
        """Bytes of one example's features (the streaming pass sizes its blocks of test examples with it)."""

    @abstractmethod
    def fingerprint(self) -> str:
        """Everything besides the weights that changes the features (parameters, loss, method, precision, device,
        the model's configuration): part of :meth:`TracIn.factor_key`."""


class ModuleGradients(GradientModel):
    """What every ``nn.Module`` family's :class:`GradientModel` shares: a frozen, eval-mode working copy of the
    model on ``device`` that :meth:`load` overwrites, and snapshots that are further copies."""

    def __init__(self, model: nn.Module, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        self.device = torch.device(device) if device is not None else module_device(model)
        self.warnings = []
        work = copy.deepcopy(model).to(self.device)
        self._work = (work.to(dtype) if dtype is not None else work).eval()
        for p in self._work.parameters():
            p.requires_grad_(False)

    def load(self, ckpt: CheckpointLike) -> None:
        self._work.load_state_dict(ckpt.state_dict(self.device))
        self._work.eval()

    def snapshot(self, ckpt: CheckpointLike) -> nn.Module:
        model = copy.deepcopy(self._work)
        model.load_state_dict(ckpt.state_dict(self.device))
        model.eval()
        return model

    def state(self, weights: nn.Module) -> Mapping[str, torch.Tensor]:
        return weights.state_dict()


class FuncGradients(ModuleGradients):
    """The generic :class:`GradientModel` of any ``nn.Module``: per-example gradients of ``loss`` (a
    :data:`models.explain.gradients.LossFn`) materialised by ``torch.func`` (``functional_call`` + ``vmap(grad)``),
    flattened in ``names`` order, and their plain dot products. Exact; each batch holds ``[batch, P]`` numbers.

    ``layers``: ``"all"``, parameter names or module names (:func:`models.explain.gradients.resolve_parameters`).
    ``dtype``: the model's copy is cast to it (default: kept), floating-point examples too, and the dot products
    are in it.
    """

    def __init__(self, model: nn.Module, loss: LossFn, layers: str | Sequence[str] = "all",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 batch_size: int = 256) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.names = resolve_parameters(model, layers)
        self.loss = loss
        self.batch_size = batch_size
        super().__init__(model, device, dtype)
        self.dtype = next(iter(self._work.parameters())).dtype if dtype is None else dtype
        self._width = parameter_count(self._work, self.names)

    def features(self, examples: torch.Tensor, weights: nn.Module | None = None) -> torch.Tensor:
        model = self._work if weights is None else weights
        examples = examples.to(self.device)
        if examples.is_floating_point():
            examples = examples.to(self.dtype)
        # [B, P] gradients: keep each vmap batch under ~256 MB
        step = max(1, min(self.batch_size, 2**26 // max(self._width, 1)))
        parts = [per_example_gradients(model, self.names, self.loss, examples[i:i + step])
                 for i in range(0, len(examples), step)]
        if not parts:
            return torch.zeros(0, self._width, dtype=self.dtype, device=self.device)
        return torch.cat(parts).to(self.dtype)

    def dots(self, fa: torch.Tensor, fb: torch.Tensor, n: int, m: int) -> torch.Tensor:
        return fa @ fb.t()

    def self_dots(self, fa: torch.Tensor, n: int) -> torch.Tensor:
        return (fa * fa).sum(1)

    def bytes_per_example(self) -> int:
        return torch.finfo(self.dtype).bits // 8 * self._width

    def fingerprint(self) -> str:
        return repr(("func", self.names, self.loss, str(self.device), str(self.dtype)))


ProgressFn = Callable[[int, int], None]
LR_WEIGHTS = ("last", "interval")


def interval_weights(epochs: Sequence[int], lr: float, lr_decay: float = 1.0) -> list[float]:
    """η_i = Σ of the learning rates of the epochs in checkpoint i's interval (previous checkpoint, epoch_i].

    TracIn's derivation replaces each SGD step z was part of by the checkpoint closest to it, so checkpoint i
    stands for every visit of z since the previous one: once per epoch, each at that epoch's rate
    lr · lr_decay^(e−1). (With a batch-mean loss every visit also carries 1/batch_size; that factor is common to
    all checkpoints and left out, as in the "last" weighting.) ``epochs`` are the checkpoints' epochs in order.
    """
    out, prev = [], 0
    for e in epochs:
        if e <= prev:
            raise ValueError(f"checkpoint epochs must increase, got {list(epochs)}")
        out.append(float(sum(lr * lr_decay ** (k - 1) for k in range(prev + 1, e + 1))))
        prev = e
    return out


class NonFiniteScores(ValueError):
    """A NaN or infinite influence: ``rows`` (test examples) and ``cols`` (training examples) where it appeared."""

    def __init__(self, rows: list[int], cols: list[int]) -> None:
        super().__init__(f"non-finite influence for test rows {rows[:10]} and training columns {cols[:10]}")
        self.rows, self.cols = rows, cols


TEST_FACTOR_BUDGET = 768 * 2**20  # bytes of cached test-side factors (all checkpoints) per block of test examples


class CandidatePairs:
    """Which columns (training examples) are candidates for which rows (test examples).

    Stored as ``(row, col)`` pairs sorted by column, so the mask of a block of columns is one contiguous slice:
    memory is the number of pairs, never rows × columns unless every pair is a candidate (then pass no
    ``CandidatePairs`` at all).
    """

    def __init__(self, rows: torch.Tensor, cols: torch.Tensor, n_rows: int, n_cols: int) -> None:
        order = torch.argsort(cols, stable=True)
        self.rows, self.cols = rows[order].long(), cols[order].long()
        self.n_rows, self.n_cols = n_rows, n_cols

    @classmethod
    def from_columns(cls, per_row: Sequence[torch.Tensor], n_cols: int) -> CandidatePairs:
        """``per_row[i]``: the candidate columns of row ``i``."""
        rows = torch.cat([torch.full((len(c),), i, dtype=torch.long) for i, c in enumerate(per_row)]) \
            if per_row else torch.empty(0, dtype=torch.long)
        cols = torch.cat([c.long() for c in per_row]) if per_row else torch.empty(0, dtype=torch.long)
        return cls(rows, cols, len(per_row), n_cols)

    def columns(self, start: int, end: int) -> CandidatePairs:
        """The pairs of columns ``[start, end)``, renumbered from 0."""
        lo, hi = (int(torch.searchsorted(self.cols, v)) for v in (start, end))
        return CandidatePairs(self.rows[lo:hi], self.cols[lo:hi] - start, self.n_rows, end - start)

    def mask(self, start: int, end: int, row0: int = 0, row1: int | None = None) -> torch.Tensor:
        """Boolean ``[row1 - row0, end - start]``: True where the column is a candidate of the row."""
        row1 = self.n_rows if row1 is None else row1
        lo, hi = (int(torch.searchsorted(self.cols, v)) for v in (start, end))
        r, c = self.rows[lo:hi], self.cols[lo:hi] - start
        keep = (r >= row0) & (r < row1)
        out = torch.zeros(row1 - row0, end - start, dtype=torch.bool)
        out[r[keep] - row0, c[keep]] = True
        return out


@dataclass
class TopInfluence:
    """Per test example: the ``k`` strongest proponents and opponents among its candidates, with counts.

    ``*_idx`` are column positions in the training examples scored (-1 in unused slots), ``*_val`` the influence,
    ``*_self`` the training example's self-influence. Ties are broken by column order (the lower column first),
    exactly as a stable sort of the full score row would.
    """

    test_self: torch.Tensor                 # [n]
    n_candidates: torch.Tensor              # [n] long
    n_positive: torch.Tensor                # [n] long
    n_negative: torch.Tensor                # [n] long
    pro_idx: torch.Tensor                   # [n, k] long
    pro_val: torch.Tensor                   # [n, k]
    pro_self: torch.Tensor                  # [n, k]
    opp_idx: torch.Tensor
    opp_val: torch.Tensor
    opp_self: torch.Tensor

    def listed(self, i: int, positive: bool) -> list[tuple[int, float, float]]:
        """``(column, influence, train self-influence)`` of row ``i``'s proponents (or opponents), strongest first."""
        idx, val, slf = (self.pro_idx, self.pro_val, self.pro_self) if positive else \
            (self.opp_idx, self.opp_val, self.opp_self)
        return [(int(j), float(v), float(s)) for j, v, s in zip(idx[i].tolist(), val[i].tolist(),
                                                               slf[i].tolist(), strict=True) if j >= 0]


def _merge_top(vals: torch.Tensor, idx: torch.Tensor, slf: torch.Tensor, new_vals: torch.Tensor,
               new_idx: torch.Tensor, new_self: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """Keep the ``k`` largest of the running ``vals`` and ``new_vals`` (-inf: empty) per row; the running entries
    come first and hold lower columns, so a stable sort keeps column order among ties."""
    v = torch.cat([vals, new_vals], 1)
    order = torch.sort(v, dim=1, descending=True, stable=True).indices[:, :k]
    return (v.gather(1, order), torch.cat([idx, new_idx], 1).gather(1, order),
            torch.cat([slf, new_self], 1).gather(1, order))




class TracIn:
    """TracIn-CP over a model family's checkpoints, through its :class:`GradientModel` (module docstring).

    ``batch_size``: training examples per chunk of the passes. ``weights``: η per checkpoint (default: each
    checkpoint's ``lr``).
    """

    def __init__(self, gradients: GradientModel, checkpoints: Sequence[CheckpointLike], batch_size: int = 256,
                 weights: Sequence[float] | None = None) -> None:
        if not checkpoints:
            raise ValueError("no checkpoints")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.gradients = gradients
        self.checkpoints = checkpoints
        self.batch_size = batch_size
        self.weights = [float(c.lr) for c in checkpoints] if weights is None else weights
        if len(self.weights) != len(self.checkpoints):
            raise ValueError(f"{len(self.weights)} weights for {len(self.checkpoints)} checkpoints")
        self._factor_key: str | None = None
        self._models: dict[int, Any] = {}  # checkpoint index -> its weights (``_use``)
        self._current: Any = None

    @property
    def names(self) -> tuple[str, ...]:
        """The parameters differentiated."""
        return self.gradients.names

    @property
    def device(self) -> torch.device:
        return self.gradients.device

    @property
    def dtype(self) -> torch.dtype:
        return self.gradients.dtype

    @property
    def warnings(self) -> list[str]:
        return self.gradients.warnings

    # -- per checkpoint ------------------------------------------------------------------------------------------
    def _load(self, ckpt: CheckpointLike) -> None:
        self.gradients.load(ckpt)

    def _use(self, index: int) -> None:
        """Make checkpoint ``index``'s weights current; each is read once and kept (a snapshot per checkpoint: the
        streaming pass visits every checkpoint for every training chunk)."""
        weights = self._models.get(index)
        if weights is None:
            weights = self.gradients.snapshot(self.checkpoints[index])
            self._models[index] = weights
        self._current = weights

    def factor_key(self) -> str:
        """A digest of everything that changes the test-side features: the weights of every checkpoint (and so
        the model version), their order and TracIn weights, and the gradient model's fingerprint (parameters, loss,
        method, precision, projection, device, ...). ``top_influence`` serves a ``test_cache`` entry only under the
        same key."""
        if self._factor_key is None:
            h = hashlib.sha256(repr((self.gradients.fingerprint(), [float(w) for w in self.weights])).encode())
            for c in range(len(self.checkpoints)):
                self._use(c)
                for name, t in sorted(self.gradients.state(self._current).items()):
                    t = t.detach().cpu().contiguous()
                    h.update(f"{c}\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
                    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
            self._factor_key = h.hexdigest()
        return self._factor_key

    def _test_bytes_per_example(self) -> int:
        """Bytes of one test example's features for one checkpoint (what a test block keeps per checkpoint)."""
        return self.gradients.bytes_per_example()

    def _features(self, examples: torch.Tensor, weights: Any = None) -> Any:
        """Gradient features of ``examples`` at ``weights`` (a snapshot; default the current weights, ``_load``)."""
        return self.gradients.features(examples, weights)

    def _pair(self, fa: Any, fb: Any, n: int, m: int) -> torch.Tensor:
        """Example-level dot products ``[n, m]``."""
        return self.gradients.dots(fa, fb, n, m)

    def _self(self, fa: Any, n: int) -> torch.Tensor:
        """Example-level self dot products ``[n]``."""
        return self.gradients.self_dots(fa, n)


    # -- public ----------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def influence(self, test: torch.Tensor, train: torch.Tensor, progress: ProgressFn | None = None,
                  train_self: bool = False) -> tuple[torch.Tensor, ...]:
        """``(scores [n_test, n_train], test_self [n_test])``, plus ``train_self [n_train]`` when asked; in the
        gradient model's dtype (fp32 unless it says otherwise), on the CPU.

        Test features are computed once per checkpoint and reused for every training batch; the training examples'
        self-influence reuses the features of the same pass.
        """
        n, m = len(test), len(train)
        scores = torch.zeros(n, m, device=self.device, dtype=self.dtype)
        test_self = torch.zeros(n, device=self.device, dtype=self.dtype)
        tr_self = torch.zeros(m, device=self.device, dtype=self.dtype)
        step = self.batch_size
        chunks = list(range(0, m, step))
        total = len(self.checkpoints) * len(chunks)
        done = 0
        for ckpt, eta in zip(self.checkpoints, self.weights, strict=True):
            self._load(ckpt)
            ft = self._features(test)
            test_self += eta * self._self(ft, n)
            for i in chunks:
                b = train[i:i + step]
                fb = self._features(b)
                scores[:, i:i + len(b)] += eta * self._pair(ft, fb, n, len(b))
                if train_self:
                    tr_self[i:i + len(b)] += eta * self._self(fb, len(b))
                done += 1
                if progress is not None:
                    progress(done, total)
        out = (scores.cpu(), test_self.cpu())
        return (*out, tr_self.cpu()) if train_self else out

    @torch.no_grad()
    def top_influence(self, test: torch.Tensor, train: torch.Tensor, k: int,
                      candidates: CandidatePairs | None = None, progress: ProgressFn | None = None,
                      test_block: int | None = None, dense: Any = None,
                      test_cache: dict | None = None) -> TopInfluence:
        """Streaming TracIn: the top-``k`` proponents and opponents of each test example among ``train``.

        Memory does not grow with ``len(test) × len(train)``: training examples are visited in chunks of
        ``batch_size``, and for each chunk the checkpoints' contributions are summed (each checkpoint's test-side
        features are computed once per block of test examples and kept) before a running top-k per test example is
        updated. Test examples are taken in blocks of ``test_block`` (default: as many as fit
        ``TEST_FACTOR_BUDGET``). ``candidates`` restricts each test example to its own columns (all when None).
        ``dense``: an optional ``[n_test, n_train]`` array (a ``numpy`` memmap, say) that receives every score.
        ``test_cache``: a dict the caller keeps between calls of this engine's settings and checkpoints over
        different ``train`` ranges with the same ``test`` (the shards of one job in one worker): when the test
        examples fit one block (``TEST_FACTOR_BUDGET``), their features and self-influence are kept in it and reused
        instead of recomputed. The call holds that block anyway, so the peak memory does not grow; between calls
        the dict holds it until the caller drops it.
        """
        n, m = len(test), len(train)
        n_ck = len(self.checkpoints)
        if test_block is None:
            test_block = max(1, TEST_FACTOR_BUDGET // max(1, n_ck * self._test_bytes_per_example()))
        test_block = max(1, min(n, test_block)) if n else 1
        step = self.batch_size
        chunks = list(range(0, m, step))
        blocks = list(range(0, n, test_block))
        total = max(1, len(blocks) * len(chunks) * n_ck)
        done = 0
        k = max(0, int(k))
        neg = float("-inf")
        out = {name: [] for name in ("test_self", "n_candidates", "n_positive", "n_negative", "pro_idx", "pro_val",
                                     "pro_self", "opp_idx", "opp_val", "opp_self")}
        for r0 in blocks:
            tb = test[r0:r0 + test_block]
            nb = len(tb)
            cacheable = test_cache is not None and len(blocks) == 1
            key = self.factor_key() if cacheable else None
            hit = test_cache.get("block") if cacheable else None
            if hit is not None and hit[3] == key and torch.equal(hit[0], tb.cpu()):
                factors, t_self = hit[1], hit[2]
            else:
                factors, t_self = [], torch.zeros(nb, device=self.device, dtype=self.dtype)
                for c, eta in enumerate(self.weights):
                    self._use(c)
                    factors.append(self._features(tb, self._current))
                    t_self += eta * self._self(factors[-1], nb)
                if cacheable:
                    test_cache["block"] = (tb.cpu().clone(), factors, t_self, key)
            n_cand = torch.zeros(nb, dtype=torch.long)
            n_pos = torch.zeros(nb, dtype=torch.long)
            n_neg = torch.zeros(nb, dtype=torch.long)
            top = {side: (torch.full((nb, k), neg, dtype=self.dtype), torch.full((nb, k), -1, dtype=torch.long),
                          torch.zeros(nb, k, dtype=self.dtype)) for side in ("pro", "opp")}
            for i in chunks:
                b = train[i:i + step]
                nb_train = len(b)
                scores = torch.zeros(nb, nb_train, device=self.device, dtype=self.dtype)
                tr_self = torch.zeros(nb_train, device=self.device, dtype=self.dtype)
                for c, eta in enumerate(self.weights):
                    self._use(c)
                    fb = self._features(b, self._current)
                    scores += eta * self._pair(factors[c], fb, nb, nb_train)
                    tr_self += eta * self._self(fb, nb_train)
                    done += 1
                    if progress is not None:
                        progress(done, total)
                del fb
                scores, tr_self = scores.cpu(), tr_self.cpu()
                bad = ~torch.isfinite(scores)
                if bool(bad.any()) or not bool(torch.isfinite(tr_self).all()):
                    rows = torch.nonzero(bad.any(1)).flatten() + r0
                    cols = torch.nonzero(bad.any(0) | ~torch.isfinite(tr_self)).flatten() + i
                    raise NonFiniteScores(rows.tolist(), cols.tolist())
                mask = None if candidates is None else candidates.mask(i, i + nb_train, r0, r0 + nb)
                if dense is not None:  # every score; NaN where a column is not the row's candidate
                    block = scores if mask is None else scores.masked_fill(~mask, float("nan"))
                    dense[r0:r0 + nb, i:i + nb_train] = block.numpy()
                pos, negm = scores > 0, scores < 0
                if mask is not None:
                    pos, negm = pos & mask, negm & mask
                    n_cand += mask.sum(1)
                else:
                    n_cand += nb_train
                n_pos += pos.sum(1)
                n_neg += negm.sum(1)
                if k:
                    cols = torch.arange(i, i + nb_train).expand(nb, nb_train)
                    selfs = tr_self.expand(nb, nb_train)
                    for side, sel, val in (("pro", pos, scores), ("opp", negm, -scores)):
                        top[side] = _merge_top(*top[side], val.masked_fill(~sel, neg), cols, selfs, k)
            if not bool(torch.isfinite(t_self).all()):
                raise NonFiniteScores((torch.nonzero(~torch.isfinite(t_self)).flatten() + r0).tolist(), [])
            out["test_self"].append(t_self.cpu())
            out["n_candidates"].append(n_cand)
            out["n_positive"].append(n_pos)
            out["n_negative"].append(n_neg)
            for side in ("pro", "opp"):
                v, ix, sf = top[side]
                empty = torch.isinf(v)
                ix = ix.masked_fill(empty, -1)
                out[f"{side}_idx"].append(ix)
                out[f"{side}_val"].append((v if side == "pro" else -v).masked_fill(empty, 0.0))
                out[f"{side}_self"].append(sf.masked_fill(empty, 0.0))
            del factors
        if not blocks:
            return TopInfluence(torch.zeros(0), *(torch.zeros(0, dtype=torch.long),) * 3,
                                *(torch.zeros(0, k, dtype=torch.long), torch.zeros(0, k), torch.zeros(0, k)) * 2)
        return TopInfluence(**{name: torch.cat(parts) for name, parts in out.items()})

    @torch.no_grad()
    def self_influence(self, examples: torch.Tensor, progress: ProgressFn | None = None) -> torch.Tensor:
        """TracIn(z, z) for every example ``[n]``."""
        out = torch.zeros(len(examples), device=self.device, dtype=self.dtype)
        step = self.batch_size
        chunks = list(range(0, len(examples), step))
        done = 0
        for ckpt, eta in zip(self.checkpoints, self.weights, strict=True):
            self._load(ckpt)
            for i in chunks:
                b = examples[i:i + step]
                out[i:i + len(b)] += eta * self._self(self._features(b), len(b))
                done += 1
                if progress is not None:
                    progress(done, len(self.checkpoints) * len(chunks))
        return out.cpu()
