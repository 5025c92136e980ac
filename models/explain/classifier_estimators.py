"""The classifiers' implementations of the data-attribution estimators, by the names of the one registry.

What each name means is stated once in ``core.estimators`` (torch-free); this table implements the names that
registry marks ``classifier_evaluated`` (tested equal), for a classifier of any format stated as a
:class:`models.explain.classifier.Classifier` (an exported program: ``models.export.influence.classifier``; a
Hugging Face model: ``models.hf.influence.classifier``). Each entry is two functions:

- ``scores(clf, checkpoints, test, train, **options) -> Tensor[m, n]``: the attribution of each of the ``n``
  training rows ``train`` to each of the ``m`` test rows ``test`` (rows as the classifier's format holds them:
  ``models.export.influence.rows``, ``models.hf.influence.rows``; the test rows' labels are the classes whose
  output is traced). A positive score says training on the example raised the test example's output (lowered its
  loss, or raised its margin). ``checkpoints``: ``"all"``, ``"last"`` or a list of the classifier's checkpoints.
- ``self_scores(clf, checkpoints, train, **options) -> Tensor[n]``: each training row's attribution to itself
  (its self-influence), which mislabel detection ranks by (high first).

Options (keywords; each function takes only its own): ``output`` (``"margin"``: the negated classification margin
of the test row, the quantity the LDS measures; ``"loss"``: its cross-entropy; the first of ``outputs`` is the
default), ``proj_dim``, ``seed``, ``damping``, ``batch_size``, ``device``, ``members`` (ensembles: further
classifiers of the same format and recipe trained with other seeds), ``ghost`` (TracIn: ``"auto"`` factorises the
linear layers where it pays, ``"none"`` materialises every gradient).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from models.explain.classifier import Classifier, check_output
from models.explain.tracin import CheckpointLike, FuncGradients, GradientModel, TracIn

RANDOM_SEED = 0
TRAK_PROJ_DIM = 2048
TRAK_DAMPING = 0.01
DEFAULT_BATCH = 64


@dataclass(frozen=True)
class Estimator:
    name: str
    scores: str        # "module:function", (clf, checkpoints, test, train, **options) -> Tensor[m, n]
    self_scores: str   # "module:function", (clf, checkpoints, train, **options) -> Tensor[n]
    ensemble: bool = False  # ``scores`` takes ``members=[Classifier, ...]``
    outputs: tuple[str, ...] = ()  # the test-side outputs ``scores`` takes as ``output=`` (the first: default)

    def load(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        return _resolve(self.scores), _resolve(self.self_scores)


def _resolve(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


_M = "models.explain.classifier_estimators"
ESTIMATORS: dict[str, Estimator] = {e.name: e for e in (
    Estimator("tracin", f"{_M}:tracin_scores", f"{_M}:tracin_self_scores", outputs=("margin", "loss")),
    Estimator("tracin_projected", f"{_M}:tracin_projected_scores", f"{_M}:tracin_projected_self_scores",
              outputs=("margin", "loss")),
    Estimator("trak", f"{_M}:trak_scores", f"{_M}:trak_self_scores", outputs=("margin",)),
    Estimator("trak_ensemble", f"{_M}:trak_ensemble_scores", f"{_M}:trak_ensemble_self_scores", ensemble=True,
              outputs=("margin",)),
    Estimator("graddot", f"{_M}:graddot_scores", f"{_M}:graddot_self_scores", outputs=("margin", "loss")),
    Estimator("gradcos", f"{_M}:gradcos_scores", f"{_M}:gradcos_self_scores", outputs=("margin", "loss")),
    Estimator("random", f"{_M}:random_scores", f"{_M}:random_self_scores"),
    Estimator("ekfac", f"{_M}:ekfac_scores", f"{_M}:ekfac_self_scores", outputs=("margin", "loss")),
)}


def names() -> tuple[str, ...]:
    return tuple(ESTIMATORS)


def ensembles() -> tuple[str, ...]:
    return tuple(n for n, e in ESTIMATORS.items() if e.ensemble)


def get(name: str) -> Estimator:
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise KeyError(f"unknown estimator {name!r}; choose from {list(ESTIMATORS)}") from None


# ------------------------------------------------------------------------------------------ helpers
def resolve(clf: Classifier, checkpoints: Any) -> list[CheckpointLike]:
    """``"all"`` (or None): every checkpoint; ``"last"``: the last; else the given checkpoints."""
    if checkpoints is None or checkpoints == "all":
        out = list(clf.checkpoints)
    elif checkpoints == "last":
        out = list(clf.checkpoints)[-1:]
    else:
        out = list(checkpoints)
    if not out:
        raise ValueError("no checkpoints")
    return out


def _with(clf: Classifier, checkpoints: Sequence[CheckpointLike]) -> Classifier:
    """``clf`` with only ``checkpoints`` (the ghost model reads the classifier's first)."""
    from dataclasses import replace

    return replace(clf, checkpoints=list(checkpoints))


def gradient_model(clf: Classifier, checkpoints: Sequence[CheckpointLike], output: str, *, ghost: str = "auto",
                   device: Any = None, batch_size: int = DEFAULT_BATCH) -> GradientModel:
    """The per-example gradients of ``output`` (``"loss"`` or ``"margin"``, :meth:`Classifier.output`) as TracIn
    consumes them: factorised for the linear layers where it pays (``ghost="auto"``,
    :class:`models.explain.ghost.GhostGradients`), or every gradient materialised (``ghost="none"``,
    :class:`models.explain.tracin.FuncGradients`). Both give the same dot products (tested element-wise)."""
    check_output(output)
    if ghost == "none":
        return FuncGradients(clf.module, clf.output(output), device=device, batch_size=batch_size)
    from models.explain.ghost import GhostGradients

    return GhostGradients(_with(clf, checkpoints), clf.output(output), clf.batch_output(output), ghost=ghost,
                          device=device, batch_size=batch_size)


def _tracin(clf: Classifier, checkpoints: Sequence[CheckpointLike], test: torch.Tensor, train: torch.Tensor,
            output: str, weights: Sequence[float] | None, ghost: str, device: Any, batch_size: int) -> torch.Tensor:
    """Σ_c η_c ⟨∇output(test), ∇ℓ(train)⟩ ``[m, n]``: the test side differentiates ``output``, the training side
    the loss (the same gradient model when ``output`` is the loss)."""
    etas = [float(c.lr) for c in checkpoints] if weights is None else [float(w) for w in weights]
    if len(etas) != len(checkpoints):
        raise ValueError(f"{len(etas)} weights for {len(checkpoints)} checkpoints")
    train_side = gradient_model(clf, checkpoints, "loss", ghost=ghost, device=device, batch_size=batch_size)
    test_side = train_side if output == "loss" else gradient_model(clf, checkpoints, output, ghost=ghost,
                                                                   device=device, batch_size=batch_size)
    out = torch.zeros(len(test), len(train), dtype=torch.float64)
    with torch.no_grad():
        for ck, eta in zip(checkpoints, etas, strict=True):
            tw = test_side.snapshot(ck)
            rw = tw if test_side is train_side else train_side.snapshot(ck)
            ft = test_side.features(test, tw)
            for i in range(0, len(train), batch_size):
                b = train[i:i + batch_size]
                out[:, i:i + len(b)] += eta * train_side.dots(ft, train_side.features(b, rw), len(test),
                                                              len(b)).double().cpu()
    return out


# ------------------------------------------------------------------------------------------ TracIn and baselines
def tracin_scores(clf: Classifier, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                  output: str = "margin", weights: Sequence[float] | None = None, ghost: str = "auto",
                  device: Any = None, batch_size: int = DEFAULT_BATCH) -> torch.Tensor:
    """TracIn-CP: Σ_c η_c ⟨∇output(test), ∇ℓ(train)⟩ over the checkpoints, η_c their learning rates (or
    ``weights``), exact (every parameter)."""
    return _tracin(clf, resolve(clf, checkpoints), test, train, output, weights, ghost, device, batch_size)


def tracin_self_scores(clf: Classifier, checkpoints: Any, train: torch.Tensor, *,
                       weights: Sequence[float] | None = None, ghost: str = "auto", device: Any = None,
                       batch_size: int = DEFAULT_BATCH) -> torch.Tensor:
    """Σ_c η_c ‖∇ℓ(z)‖² (Pruthi et al.'s self-influence)."""
    ckpts = resolve(clf, checkpoints)
    engine = TracIn(gradient_model(clf, ckpts, "loss", ghost=ghost, device=device, batch_size=batch_size), ckpts,
                    batch_size=batch_size, weights=weights)
    return engine.self_influence(train).double()


def graddot_scores(clf: Classifier, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                   output: str = "margin", ghost: str = "auto", device: Any = None,
                   batch_size: int = DEFAULT_BATCH) -> torch.Tensor:
    """⟨∇output(test), ∇ℓ(train)⟩ at the last checkpoint alone, unweighted."""
    return _tracin(clf, resolve(clf, checkpoints)[-1:], test, train, output, [1.0], ghost, device, batch_size)


def _norms(clf: Classifier, ck: CheckpointLike, rows: torch.Tensor, output: str, ghost: str, device: Any,
           batch_size: int) -> torch.Tensor:
    model = gradient_model(clf, [ck], output, ghost=ghost, device=device, batch_size=batch_size)
    w = model.snapshot(ck)
    with torch.no_grad():
        return torch.cat([model.self_dots(model.features(rows[i:i + batch_size], w), len(rows[i:i + batch_size]))
                          .double().cpu() for i in range(0, len(rows), batch_size)]).clamp_min(0).sqrt()


def gradcos_scores(clf: Classifier, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                   output: str = "margin", ghost: str = "auto", device: Any = None,
                   batch_size: int = DEFAULT_BATCH) -> torch.Tensor:
    """:func:`graddot_scores` divided by the two gradients' norms (0 where a gradient is 0)."""
    ck = resolve(clf, checkpoints)[-1]
    dots = _tracin(clf, [ck], test, train, output, [1.0], ghost, device, batch_size)
    den = _norms(clf, ck, test, output, ghost, device, batch_size)[:, None] * \
        _norms(clf, ck, train, "loss", ghost, device, batch_size)[None, :]
    return torch.where(den > 0, dots / den.clamp_min(1e-300), torch.zeros_like(dots))


def graddot_self_scores(clf: Classifier, checkpoints: Any, train: torch.Tensor, *, ghost: str = "auto",
                        device: Any = None, batch_size: int = DEFAULT_BATCH) -> torch.Tensor:
    """‖∇ℓ(z)‖² at the last checkpoint."""
    return _norms(clf, resolve(clf, checkpoints)[-1], train, "loss", ghost, device, batch_size) ** 2


def gradcos_self_scores(clf: Classifier, checkpoints: Any, train: torch.Tensor) -> torch.Tensor:
    """A gradient's cosine with itself: 1 for every example (no ranking: AUC 0.5 by construction)."""
    return torch.ones(len(train), dtype=torch.float64)


def random_scores(clf: Classifier, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                  seed: int = RANDOM_SEED) -> torch.Tensor:
    """Standard normal noise, seeded: LDS about 0."""
    return torch.randn(len(test), len(train), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def random_self_scores(clf: Classifier, checkpoints: Any, train: torch.Tensor, *, seed: int = RANDOM_SEED
                       ) -> torch.Tensor:
    return torch.randn(len(train), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ------------------------------------------------------------------------------------------ projected
def _projector(clf: Classifier, output: str, proj_dim: int, seed: int, device: Any, batch_size: int,
               projection: str = "kronecker") -> Any:
    from models.explain.trak import FuncProjector

    fn = clf.margin if output == "trak" else clf.output(output)
    return FuncProjector(clf.module, fn, proj_dim=proj_dim, seed=seed, device=device, batch_size=batch_size,
                         projection=projection)


def tracin_projected_scores(clf: Classifier, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                            output: str = "margin", proj_dim: int = TRAK_PROJ_DIM, seed: int = 0,
                            projection: str = "kronecker", weights: Sequence[float] | None = None,
                            device: Any = None, batch_size: int = DEFAULT_BATCH) -> torch.Tensor:
    """TracIn-CP with every gradient projected to ``proj_dim`` (one seeded projection for both sides):
    Σ_c η_c φ_c(test)ᵀ φ_c(train), an unbiased estimate of :func:`tracin_scores`."""
    from models.explain.trak import checkpoint_etas

    ckpts = resolve(clf, checkpoints)
    etas = checkpoint_etas(ckpts, weights)
    train_side = _projector(clf, "loss", proj_dim, seed, device, batch_size, projection)
    test_side = train_side if output == "loss" else _projector(clf, output, proj_dim, seed, device, batch_size,
                                                               projection)
    out = torch.zeros(len(test), len(train), dtype=torch.float64)
    for ck, eta in zip(ckpts, etas, strict=True):
        train_side.load(ck)
        test_side.load(ck)
        out += eta * (test_side.features(test) @ train_side.features(train).t()).double().cpu()
    return out


def tracin_projected_self_scores(clf: Classifier, checkpoints: Any, train: torch.Tensor, *,
                                 proj_dim: int = TRAK_PROJ_DIM, seed: int = 0, projection: str = "kronecker",
                                 weights: Sequence[float] | None = None, device: Any = None,
                                 batch_size: int = DEFAULT_BATCH) -> torch.Tensor:
    from models.explain.trak import checkpoint_etas

    ckpts = resolve(clf, checkpoints)
    proj = _projector(clf, "loss", proj_dim, seed, device, batch_size, projection)
    out = torch.zeros(len(train), dtype=torch.float64)
    for ck, eta in zip(ckpts, checkpoint_etas(ckpts, weights), strict=True):
        proj.load(ck)
        phi = proj.features(train).double().cpu()
        out += eta * (phi * phi).sum(1)
    return out


def trak_weights(clf: Classifier, train: torch.Tensor, ckpt: CheckpointLike | None = None,
                 device: Any = None) -> torch.Tensor:
    """TRAK's Q at one checkpoint: each training row's 1 - p(its label) under the weights of ``ckpt`` (default the
    last)."""
    module = clf.at(ckpt if ckpt is not None else clf.checkpoints[-1], device)
    probs = torch.softmax(clf.logits(module, train).double(), 1)
    return 1.0 - probs[torch.arange(len(train)), clf.labels(train).cpu()]


def checkpoint_index(clf: Classifier, ckpt: CheckpointLike, position: int = 0) -> int:
    """The position of ``ckpt`` among the classifier's checkpoints (the same object, else the same name), what its
    TRAK projection seed derives from (:func:`models.explain.trak.checkpoint_seed`); ``position`` (its place in the
    list it was given in) for a checkpoint that is not one of them."""
    own = list(clf.checkpoints)
    for i, c in enumerate(own):
        if c is ckpt:
            return i
    name = getattr(ckpt, "name", None)
    if name is not None:
        for i, c in enumerate(own):
            if getattr(c, "name", None) == name:
                return i
    return position


def _trak_sum(clf: Classifier, checkpoints: Sequence[CheckpointLike], test: torch.Tensor | None,
              train: torch.Tensor, proj_dim: int, seed: int, damping: float, device: Any, batch_size: int,
              model: int = 0, projection: str = "kronecker") -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ_c K_c, Σ_c Q_c)`` over ``checkpoints`` (float64, CPU), margin features on both sides: ``K_c`` the
    kernel φ_c(test)(Φ_cᵀΦ_c + λ_c I)⁻¹Φ_cᵀ ``[m, n]`` with checkpoint c's own projection (seed
    :func:`models.explain.trak.checkpoint_seed` of ``seed``, ``model`` and its :func:`checkpoint_index`), or with
    ``test`` None each training row's φ_c(z)ᵀ(Φ_cᵀΦ_c + λ_c I)⁻¹φ_c(z) ``[n]``; ``Q_c`` the training rows' 1 - p at
    checkpoint c (:func:`trak_weights`) ``[n]``. ``projection``: ``kronecker`` (a per-layer Kronecker product of
    two Gaussian factors, the default) or ``dense`` (one dense Gaussian matrix, the TRAK paper's and dattri's
    choice; lower variance, ``proj_dim`` × parameters of memory)."""
    from models.explain.trak import check_damping, checkpoint_seed, gram_of, trak_query

    check_damping(damping)
    proj = None
    shape = (len(train),) if test is None else (len(test), len(train))
    kernel = torch.zeros(shape, dtype=torch.float64)
    q = torch.zeros(len(train), dtype=torch.float64)
    for pos, ck in enumerate(checkpoints):
        s = checkpoint_seed(seed, checkpoint_index(clf, ck, pos), model)
        if proj is None:
            proj = _projector(clf, "trak", proj_dim, s, device, batch_size, projection)
        proj.reseed(s)
        proj.load(ck)
        phi = proj.features(train)
        if test is None:
            kernel += (trak_query(gram_of(phi), damping, phi.double()) * phi.double()).sum(1).cpu()
        else:
            kernel += (trak_query(gram_of(phi), damping, proj.features(test).double()) @ phi.double().t()).cpu()
        q += trak_weights(clf, train, ck, device=device)
    return kernel, q


def trak_scores(clf: Classifier, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                proj_dim: int = TRAK_PROJ_DIM, seed: int = 0, damping: float = TRAK_DAMPING, device: Any = None,
                batch_size: int = DEFAULT_BATCH, projection: str = "kronecker") -> torch.Tensor:
    """TRAK on one model (Park et al. 2023, Algorithm 1, the checkpoints in the role of its models): projected
    margin gradients with an independent projection per checkpoint, the damped Gauss-Newton inverse per checkpoint,
    the kernels averaged over the checkpoints, each training column times its Q (:func:`trak_weights`) averaged over
    the same checkpoints."""
    return trak_ensemble_scores(clf, checkpoints, test, train, members=(), proj_dim=proj_dim, seed=seed,
                                damping=damping, device=device, batch_size=batch_size, projection=projection)


def _ensemble(clf: Classifier, checkpoints: Any, test: torch.Tensor | None, train: torch.Tensor,
              members: Sequence[Classifier], proj_dim: int, seed: int, damping: float, device: Any,
              batch_size: int, projection: str = "kronecker") -> torch.Tensor:
    models = [clf, *members]
    kernel: torch.Tensor | float = 0.0
    q: torch.Tensor | float = 0.0
    count = 0
    for i, m in enumerate(models):
        ckpts = resolve(m, checkpoints if (i == 0 or isinstance(checkpoints, str) or checkpoints is None)
                        else "last")
        k_sum, q_sum = _trak_sum(m, ckpts, test, train, proj_dim, seed, damping, device, batch_size, model=i,
                                 projection=projection)
        kernel, q, count = kernel + k_sum, q + q_sum, count + len(ckpts)
    q_mean = q / count
    return kernel / count * (q_mean if test is None else q_mean[None, :])


def trak_ensemble_scores(clf: Classifier, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                         members: Sequence[Classifier] = (), proj_dim: int = TRAK_PROJ_DIM, seed: int = 0,
                         damping: float = TRAK_DAMPING, device: Any = None,
                         batch_size: int = DEFAULT_BATCH, projection: str = "kronecker") -> torch.Tensor:
    """TRAK's model ensemble (Park et al. 2023, eq. 17 and Algorithm 1): for the model ``clf`` (model 0) and every
    one of ``members`` (models 1, 2, ... of the same recipe trained with other seeds), each with its own checkpoints
    and an independent projection per (model, checkpoint), the average of φ(test)(ΦᵀΦ + λI)⁻¹Φᵀ over every (model,
    checkpoint), times the average over the same (model, checkpoint) pairs of each training row's Q at those
    weights. ``checkpoints`` selects the checkpoints of every model alike (``"all"`` or ``"last"``; a list applies
    to ``clf`` only, the members then use their last)."""
    return _ensemble(clf, checkpoints, test, train, members, proj_dim, seed, damping, device, batch_size,
                     projection)


def trak_self_scores(clf: Classifier, checkpoints: Any, train: torch.Tensor, *, proj_dim: int = TRAK_PROJ_DIM,
                     seed: int = 0, damping: float = TRAK_DAMPING, device: Any = None,
                     batch_size: int = DEFAULT_BATCH, projection: str = "kronecker") -> torch.Tensor:
    """Each training row's TRAK score on itself: φ(z)ᵀ(ΦᵀΦ + λI)⁻¹φ(z) averaged over the checkpoints (each with its
    own projection), times its Q averaged over them (:func:`trak_scores` on the diagonal)."""
    return trak_ensemble_self_scores(clf, checkpoints, train, members=(), proj_dim=proj_dim, seed=seed,
                                     damping=damping, device=device, batch_size=batch_size, projection=projection)


def trak_ensemble_self_scores(clf: Classifier, checkpoints: Any, train: torch.Tensor, *,
                              members: Sequence[Classifier] = (), proj_dim: int = TRAK_PROJ_DIM, seed: int = 0,
                              damping: float = TRAK_DAMPING, device: Any = None,
                              batch_size: int = DEFAULT_BATCH, projection: str = "kronecker") -> torch.Tensor:
    """The ensemble's self-influence: φ(z)ᵀ(ΦᵀΦ + λI)⁻¹φ(z) averaged over every (model, checkpoint), times Q
    averaged over the same pairs (:func:`trak_ensemble_scores` on the diagonal)."""
    return _ensemble(clf, checkpoints, None, train, members, proj_dim, seed, damping, device, batch_size,
                     projection)


# ------------------------------------------------------------------------------------------ EK-FAC
def ekfac_scores(clf: Classifier, checkpoints: Any, test: torch.Tensor, train: torch.Tensor, *,
                 output: str = "margin", damping: float | None = None, seed: int = 0, device: Any = "cpu",
                 batch_size: int = DEFAULT_BATCH) -> torch.Tensor:
    """Influence functions with EK-FAC through Kronfluence (:mod:`models.explain.ekfac`) at the trained weights:
    the last of ``checkpoints``."""
    from models.explain.ekfac import ekfac_scores as scores

    ck = resolve(clf, checkpoints)[-1]
    return scores(_with(clf, [ck]), test, train, output=output, damping=damping, batch_size=batch_size,
                  device=device or "cpu", seed=seed).double()


def ekfac_self_scores(clf: Classifier, checkpoints: Any, train: torch.Tensor, *, damping: float | None = None,
                      seed: int = 0, device: Any = "cpu", batch_size: int = DEFAULT_BATCH) -> torch.Tensor:
    from models.explain.ekfac import ekfac_self_scores as self_scores

    ck = resolve(clf, checkpoints)[-1]
    return self_scores(_with(clf, [ck]), train, damping=damping, batch_size=batch_size, device=device or "cpu",
                       seed=seed).double()
