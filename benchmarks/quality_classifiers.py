"""Data attribution on a classifier, against dattri on the same work: LDS and mislabel detection on scikit-learn's
digits for explainq's estimators and dattri's own attributors, run on the same models, checkpoints, subsets and
output.

The model: a small MLP (``models.export.demo.DigitsMLP``, 64-32-10), exported with ``torch.export`` from seeded
initial weights and trained through the service's classifier trainer (``models.export.train.train``: SGD with
momentum, checkpoints every ``--checkpoint-every`` epochs). Every model of a run (the full-data model, ``--m``
subset models at ``--alpha``, their replicates, the ensemble members, the mislabel model) is trained from those
same initial weights (``models.export.evaluation``); the seeds (subset masks, training orders, test draws) are
``models.kg.evaluation``'s, derived from the replicate's seed.

Two replicates that share nothing: the **development** replicate (its own full-data model, ``--m-dev`` subset
models, ``--n-dev`` test examples from the validation split; seed ``--dev-seed``) on which
every estimator's hyper-parameters are chosen from a grid of the same size for the same estimator in both
libraries (the grid and each point's LDS are printed), and the **measurement** replicate (``--seed``: another
full-data model, other subsets, ``--n-test`` test examples of the test split), on which each estimator runs once
with its chosen setting. Ground truth: each subset model's margin ``log p / (1 - p)`` on the test examples; every
estimator traces that margin on the test side (``output="margin"``; dattri: ``target_func`` the negated margin
for TracIn and the influence function, the margin for TRAK, as TRAK defines it). LDS per test example is
``models.kg.evaluation.lds_per_test`` (equal to dattri's ``lds``: ``tests/test_dattri_lds.py``), with 95%
percentile bootstrap intervals over test examples; the differences explainq - dattri per estimator and the ratios
to explainq's TracIn are paired bootstraps over the same test examples. Mislabel detection: ``--fraction`` of the
training labels flipped to another class, the recipe trained on them, each estimator's self-influence ranked
(AUC with a bootstrap interval over examples).

dattri's attributors run on the eager ``DigitsMLP`` at the checkpoints' weights (the module the program was
exported from; its logits are checked equal to the program's before anything is measured).

    python benchmarks/quality_classifiers.py            # m 64, m-dev 24, 200 test examples
    python benchmarks/quality_classifiers.py --quick    # a tiny run (the slow test runs it)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TQDM_DISABLE", "1")  # dattri's progress bars

import numpy as np  # noqa: E402
import torch  # noqa: E402

from models.explain.classifier import Classifier  # noqa: E402
from models.explain.classifier_estimators import get as get_estimator  # noqa: E402
from models.export import evaluation as ef  # noqa: E402
from models.export.demo import DIGITS_LABELS, DigitsMLP, digits_arrays, digits_program, training_mean  # noqa: E402
from models.export.influence import ProgramModule, classifier, read_checkpoints  # noqa: E402
from models.export.influence import rows as rows_of  # noqa: E402
from models.export.program import load  # noqa: E402
from models.export.train import Split  # noqa: E402
from models.kg import evaluation as ev  # noqa: E402
from models.training import TrainOptions  # noqa: E402

REFERENCE = "explainq tracin"
# the estimators both libraries implement (compared pairwise)
FAMILIES = ("tracin", "trak", "ekfac")
# The grids, the same for both libraries (docs/quality.md: how they were widened on the development replicate)
RELATIVE_DAMPING = (1e-2, 1e-1, 1.0)  # TRAK's λ as a fraction of tr(ΦᵀΦ)/k
PROJ_DIMS = (512, 2048)
EKFAC_DAMPING = (1e-5, 1e-3, 1e-1)    # absolute, beside each library's default (Kronfluence's heuristic; dattri's 0)

# dattri's published MNIST-10 results (Deng et al. 2024, NeurIPS; README "Benchmark Results") are bar charts
# (assets/images/benchmark-result-mnist.png), not numbers in text; no MNIST figure is quoted here for that reason.
# The ranges benchmarks/quality.py prints as context for its ConvE tables are repeated, labelled as such.
PUBLISHED_CONTEXT = ["dattri's published figures (context, not our measurement): its MNIST-10 LR/MLP LDS results "
                     "are published as charts (README 'Benchmark Results', Deng et al. 2024), without numbers in "
                     "text, so none is quoted; benchmarks/quality.py quotes their benchmark ranges "
                     "TracIn LDS 0.07-0.13, TRAK 0.26-0.37 (10-50 checkpoints), mislabel AUC TracIn 0.51, "
                     "TRAK 0.66 (other models and data)."]


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    return ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]]


def _fmt(v: Any, digits: int = 3) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def _iv(d: dict[str, Any], digits: int = 3) -> str:
    return f"[{_fmt(d.get('low'), digits)}, {_fmt(d.get('high'), digits)}]"


SPEC = {"input": {"kind": "image", "mean": [training_mean()]}, "labels": DIGITS_LABELS}


# ------------------------------------------------------------------------------------------ replicates
@dataclass
class Replicate:
    """One full-data model (its Classifier and its checkpoints as eager state dicts), its test examples and its
    subset models' masks and margins (``[M, n]``, ``[M, m]``; ``again``: the replicates' margins or None)."""

    name: str
    seed: int
    clf: Classifier
    states: list[dict[str, torch.Tensor]]
    lrs: list[float]
    train: Split
    test: Split
    masks: np.ndarray
    outputs: np.ndarray
    again: np.ndarray | None = None
    members: list[Classifier] = field(default_factory=list)

    @property
    def train_rows(self) -> torch.Tensor:
        return rows_of(self.train.inputs, self.train.labels)

    @property
    def test_rows(self) -> torch.Tensor:
        return rows_of(self.test.inputs, self.test.labels)


def _full(init: Path, data: Split, opts: TrainOptions, seed: int, out: Path
          ) -> tuple[Classifier, list[dict[str, torch.Tensor]], list[float]]:
    """The recipe on ``data`` (training seed ``seed``), read back as the service reads a trained model."""
    ef.train_recipe(init, SPEC, data, opts, seed, out=out)
    module = ProgramModule(load(out))
    ckpts = read_checkpoints(out, module)
    states = [{k.replace("__", "."): v.clone() for k, v in c.state.items()} for c in ckpts.states]
    return classifier(module, ckpts.states), states, [c.lr for c in ckpts.states]


def _check_eager(clf: Classifier, states: list[dict[str, torch.Tensor]], x: torch.Tensor) -> float:
    """The eager MLP at the last checkpoint computes the program's logits (max abs difference, asserted small)."""
    eager = DigitsMLP().eval()
    eager.load_state_dict(states[-1])
    with torch.no_grad():
        ours = clf.logits(clf.at(clf.checkpoints[-1]), rows_of(x, torch.zeros(len(x))))
        diff = float((eager(x) - ours).abs().max())
    if diff > 1e-4:
        raise AssertionError(f"the eager MLP differs from the program by {diff}")
    return diff


def replicate(name: str, seed: int, init: Path, data: Split, pool: Split, n_test: int, m: int,
              opts: TrainOptions, alpha: float, work: Path, members: int = 0, again: bool = False) -> Replicate:
    t0 = time.perf_counter()
    clf, states, lrs = _full(init, data, opts, ev.full_model_seed(seed, opts.seed), work / f"{name}-full")
    sel = torch.from_numpy(ev.test_selection(len(pool.labels), n_test, seed))
    test = Split(pool.inputs[sel], pool.labels[sel])
    subs = [ef.train_subset(init, SPEC, data, opts, alpha, s, t, test)
            for s, t in zip(ev.subset_seeds(seed, m), ev.subset_train_seeds(seed, m), strict=True)]
    reps = None
    if again:
        reps = np.stack([ef.train_subset(init, SPEC, data, opts, alpha, s, t, test)["outputs"]
                         for s, t in zip(ev.subset_seeds(seed, m), ev.subset_replicate_seeds(seed, m), strict=True)])
    extra = [_full(init, data, opts, s, work / f"{name}-member-{s}")[0]
             for s in ev.member_seeds(ev.full_model_seed(seed, opts.seed), members)]
    rep = Replicate(name, seed, clf, states, lrs, data, test, np.stack([s["mask"] for s in subs]),
                    np.stack([s["outputs"] for s in subs]), reps, extra)
    _check_eager(clf, states, test.inputs)
    print(f"# {name} replicate (seed {seed}): full model + {m} subset models"
          + (f" + {m} replicates" if again else "") + (f" + {members} members" if members else "")
          + f" trained in {time.perf_counter() - t0:.1f} s", flush=True)
    return rep


# ------------------------------------------------------------------------------------------ dattri's side
def _xy(split: Split) -> tuple[torch.Tensor, torch.Tensor]:
    return split.inputs.reshape(len(split.inputs), -1).float(), split.labels.long()


def _loader(split: Split, batch: int = 64) -> torch.utils.data.DataLoader:
    x, y = _xy(split)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=False)


class DattriFunctions:
    """The functions dattri's tasks take (``f(params, (x, y))``, ``torch.func`` style) for the eager MLP: the
    cross-entropy (the training loss), the margin and its negation, and p(label) (TRAK's Q). Each works on one
    example (as dattri's vmap gives it) and on a batch (EK-FAC's fitting passes)."""

    def __init__(self) -> None:
        from models.explain.gradients import classification_margin

        self.model = DigitsMLP().eval()
        model, margin = self.model, classification_margin

        def logits(params, x):
            return torch.func.functional_call(model, params, (x.reshape(-1, 64),))

        self.loss = lambda params, data: torch.nn.functional.cross_entropy(logits(params, data[0]),
                                                                           data[1].reshape(-1))
        self.margin = lambda params, data: margin(logits(params, data[0]), data[1].reshape(-1))
        self.neg_margin = lambda params, data: -margin(logits(params, data[0]), data[1].reshape(-1))
        self.prob = lambda params, data: torch.exp(-torch.nn.functional.cross_entropy(
            logits(params, data[0]), data[1].reshape(-1)))

    def task(self, loss: Callable, target: Callable, states: list[dict[str, torch.Tensor]]) -> Any:
        from dattri.task import AttributionTask

        return AttributionTask(loss_func=loss, model=self.model, checkpoints=[dict(s) for s in states],
                               target_func=target)

    def grad_scale(self, states: list[dict[str, torch.Tensor]], split: Split) -> float:
        """Σ_i ‖∇margin_i‖² / p, averaged over the checkpoints: tr of dattri's TRAK kernel times k (its gradients are
        divided by √p and its projection preserves norms), so that both libraries' TRAK damping grids are the same
        fractions of tr(K)/k."""
        x, y = _xy(split)
        total = 0.0
        for s in states:
            params = {k: v.detach() for k, v in s.items()}
            g = torch.func.vmap(torch.func.grad(self.margin), in_dims=(None, 0))(params, (x, y))
            total += float(sum((v.reshape(len(x), -1) ** 2).sum() for v in g.values()))
        p = sum(v.numel() for v in states[0].values())
        return total / len(states) / p


def dattri_tracin(fx: DattriFunctions, rep: Replicate, cfg: dict[str, Any]) -> np.ndarray:
    from dattri.algorithm.tracin import TracInAttributor

    idx = range(len(rep.states)) if cfg["checkpoints"] == "all" else [len(rep.states) - 1]
    attr = TracInAttributor(fx.task(fx.loss, fx.neg_margin, [rep.states[i] for i in idx]),
                            weight_list=torch.tensor([rep.lrs[i] for i in idx]), normalized_grad=False)
    attr.projector_kwargs = None  # exact gradient dot products (its unprojected path), as explainq's TracIn
    return attr.attribute(_loader(rep.train), _loader(rep.test)).T.detach().double().numpy()


def dattri_tracin_self(fx: DattriFunctions, rep: Replicate, cfg: dict[str, Any]) -> np.ndarray:
    from dattri.algorithm.tracin import TracInAttributor

    idx = range(len(rep.states)) if cfg["checkpoints"] == "all" else [len(rep.states) - 1]
    attr = TracInAttributor(fx.task(fx.loss, fx.loss, [rep.states[i] for i in idx]),
                            weight_list=torch.tensor([rep.lrs[i] for i in idx]), normalized_grad=False)
    attr.projector_kwargs = None
    return attr.self_attribute(_loader(rep.train)).detach().double().numpy()


def _dattri_trak(fx: DattriFunctions, rep: Replicate, cfg: dict[str, Any], cache: bool = True) -> Any:
    from dattri.algorithm.trak import TRAKAttributor

    reg = cfg["damping"] * fx.grad_scale(rep.states, rep.train) / cfg["proj_dim"]
    attr = TRAKAttributor(fx.task(fx.margin, fx.margin, rep.states), correct_probability_func=fx.prob,
                          projector_kwargs={"proj_dim": cfg["proj_dim"], "proj_max_batch_size": 32, "proj_seed": 0,
                                            "device": "cpu"}, regularization=reg)
    if cache:
        attr.cache(_loader(rep.train))
    return attr


def dattri_trak(fx: DattriFunctions, rep: Replicate, cfg: dict[str, Any]) -> np.ndarray:
    return _dattri_trak(fx, rep, cfg).attribute(_loader(rep.test)).T.detach().double().numpy()


def dattri_trak_self(fx: DattriFunctions, rep: Replicate, cfg: dict[str, Any]) -> np.ndarray:
    # dattri 0.3.0 returns TRAK's self-influence as [n, 1]
    return _dattri_trak(fx, rep, cfg, cache=False).self_attribute(_loader(rep.train)).detach().double().numpy() \
        .reshape(-1)


def _dattri_ekfac(fx: DattriFunctions, rep: Replicate, cfg: dict[str, Any]) -> Any:
    from dattri.algorithm.influence_function import IFAttributorEKFAC

    # the curvature is fitted on the training loss (the task's target while it caches), at the trained weights
    attr = IFAttributorEKFAC(fx.task(fx.loss, fx.loss, rep.states[-1:]), damping=cfg["damping"])
    attr.cache(_loader(rep.train))
    return attr


def dattri_ekfac(fx: DattriFunctions, rep: Replicate, cfg: dict[str, Any]) -> np.ndarray:
    attr = _dattri_ekfac(fx, rep, cfg)
    attr.task = fx.task(fx.loss, fx.neg_margin, rep.states[-1:])  # the test side: the negated margin
    return attr.attribute(_loader(rep.train), _loader(rep.test)).T.detach().double().numpy()


def dattri_ekfac_self(fx: DattriFunctions, rep: Replicate, cfg: dict[str, Any]) -> np.ndarray:
    # one batch: dattri 0.3.0's inner-product self_attribute adds every batch's values into the whole output
    # (no offset), so only a single batch gives each example its own value
    train = _loader(rep.train, batch=len(rep.train.labels))
    return _dattri_ekfac(fx, rep, cfg).self_attribute(train).detach().double().numpy()


# ------------------------------------------------------------------------------------------ explainq's side
def _ours(name: str, rep: Replicate, cfg: dict[str, Any], self_scores: bool = False) -> np.ndarray:
    scores, self_fn = get_estimator(name).load()
    opts = dict(cfg)
    ckpts = opts.pop("checkpoints", "all")
    if name == "trak_ensemble":
        opts["members"] = rep.members
    if self_scores:
        return self_fn(rep.clf, ckpts, rep.train_rows, **opts).double().numpy()
    if name != "trak" and name != "trak_ensemble":
        opts["output"] = "margin"
    return scores(rep.clf, ckpts, rep.test_rows, rep.train_rows, **opts).double().numpy()


def trak_former(rep: Replicate, cfg: dict[str, Any]) -> np.ndarray:
    """The convention explainq's ``trak`` followed before (no longer offered): one projection (the seed itself) for
    every checkpoint, the kernels averaged over the checkpoints, times Q at the trained model (the last checkpoint)
    alone. A diagnostic row, from the estimator table's own building blocks."""
    from models.explain.classifier_estimators import _projector, trak_weights
    from models.explain.trak import gram_of, trak_query

    ckpts = list(rep.clf.checkpoints)
    proj = _projector(rep.clf, "trak", cfg["proj_dim"], 0, None, 64)
    total = torch.zeros(len(rep.test_rows), len(rep.train_rows), dtype=torch.float64)
    for ck in ckpts:
        proj.load(ck)
        phi = proj.features(rep.train_rows)
        total += trak_query(gram_of(phi), cfg["damping"], proj.features(rep.test_rows).double()) @ phi.double().t()
    q = trak_weights(rep.clf, rep.train_rows, ckpts[-1])
    return (total / len(ckpts) * q[None, :]).double().numpy()


@dataclass
class Entry:
    name: str       # the row's name
    family: str     # tracin, trak, ekfac (the estimator compared across libraries)
    library: str
    grid: list[dict[str, Any]]
    scores: Callable[[Replicate, dict[str, Any]], np.ndarray]
    self_scores: Callable[[Replicate, dict[str, Any]], np.ndarray] | None
    tuned_as: str | None = None  # takes the setting chosen for another entry


def entries(fx: DattriFunctions, ensemble: int) -> list[Entry]:
    trak_grid = [{"proj_dim": k, "damping": d} for k in PROJ_DIMS for d in RELATIVE_DAMPING]
    ck_grid = [{"checkpoints": "all"}, {"checkpoints": "last"}]
    out = [
        Entry("explainq tracin", "tracin", "explainq", ck_grid, lambda r, c: _ours("tracin", r, c),
              lambda r, c: _ours("tracin", r, c, True)),
        Entry("dattri TracIn", "tracin", "dattri", ck_grid, lambda r, c: dattri_tracin(fx, r, c),
              lambda r, c: dattri_tracin_self(fx, r, c)),
        Entry("explainq trak", "trak", "explainq", trak_grid, lambda r, c: _ours("trak", r, c),
              lambda r, c: _ours("trak", r, c, True)),
        Entry("dattri TRAK", "trak", "dattri", trak_grid, lambda r, c: dattri_trak(fx, r, c),
              lambda r, c: dattri_trak_self(fx, r, c)),
        Entry("explainq ekfac", "ekfac", "explainq", [{"damping": None}] + [{"damping": d} for d in EKFAC_DAMPING],
              lambda r, c: _ours("ekfac", r, c), lambda r, c: _ours("ekfac", r, c, True)),
        Entry("dattri EK-FAC IF", "ekfac", "dattri", [{"damping": 0.0}] + [{"damping": d} for d in EKFAC_DAMPING],
              lambda r, c: dattri_ekfac(fx, r, c), lambda r, c: dattri_ekfac_self(fx, r, c)),
    ]
    out.append(Entry("explainq trak, dense projection", "trak_dense", "explainq", [],
                     lambda r, c: _ours("trak", r, {**c, "projection": "dense"}),
                     lambda r, c: _ours("trak", r, {**c, "projection": "dense"}, True), tuned_as="explainq trak"))
    out.append(Entry("(diagnostic) former explainq trak: one projection, Q at the last checkpoint", "trak_former",
                     "explainq", [], trak_former, None, tuned_as="explainq trak"))
    if ensemble:
        out.append(Entry(f"explainq trak_ensemble ({ensemble + 1} models)", "trak_ensemble", "explainq", [],
                         lambda r, c: _ours("trak_ensemble", r, c), None, tuned_as="explainq trak"))
    return out


# ------------------------------------------------------------------------------------------ the run
def _lds(rep: Replicate, scores: np.ndarray) -> np.ndarray:
    return ev.lds_per_test(rep.masks, rep.outputs, scores)


def tune(entry: Entry, dev: Replicate, lines: list[list[str]]) -> dict[str, Any]:
    best, best_v = entry.grid[0], -np.inf
    for cfg in entry.grid:
        t0 = time.perf_counter()
        try:
            per = _lds(dev, entry.scores(dev, cfg))
            v = float(np.nanmean(per)) if np.isfinite(per).any() else float("nan")
        except Exception as exc:  # a setting the implementation refuses (singular kernel, ...) loses
            v, per = float("nan"), None
            print(f"# {entry.name} {cfg}: {type(exc).__name__}: {exc}", flush=True)
        lines.append([entry.name, _cfg(cfg), _fmt(v), f"{time.perf_counter() - t0:.1f}", ""])
        if math.isfinite(v) and v > best_v:
            best, best_v = cfg, v
    for row in lines[-len(entry.grid):]:
        if row[1] == _cfg(best):
            row[-1] = "chosen"
    return best


def _cfg(cfg: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items()) or "-"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The run's tables (``lines``) and its numbers: ``chosen`` (estimator -> setting), ``lds`` (estimator ->
    ``mean_interval``), ``ratio`` (to TracIn), ``difference`` (family -> ``difference_interval``), ``seconds``,
    ``best``, ``ceiling`` and ``mislabel`` (estimator -> ``auc_interval``)."""
    torch.set_num_threads(args.threads)
    arrays = digits_arrays(0)
    split = {s: Split(torch.from_numpy(x), torch.from_numpy(y)) for s, (x, y) in arrays.items()}
    opts = TrainOptions(epochs=args.epochs, batch_size=32, lr=args.lr, checkpoint_every=args.checkpoint_every,
                        seed=0)
    out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="quality-classifiers-") as tmp:
        work = Path(tmp)
        init = digits_program(work / "init", seed=args.init_seed, architecture="mlp") / "model.pt2"
        dev = replicate("development", args.dev_seed, init, split["train"], split["valid"], args.n_dev, args.m_dev,
                        opts, args.alpha, work, members=args.ensemble)
        meas = replicate("measurement", args.seed, init, split["train"], split["test"], args.n_test, args.m, opts,
                         args.alpha, work, members=args.ensemble, again=True)
        fx = DattriFunctions()
        table = entries(fx, args.ensemble)
        grid_rows: list[list[str]] = []
        chosen: dict[str, dict[str, Any]] = {}
        for e in table:
            chosen[e.name] = chosen[e.tuned_as] if e.tuned_as else tune(e, dev, grid_rows)
        # the measurement: each estimator once, with its chosen setting
        per_test: dict[str, np.ndarray] = {}
        seconds: dict[str, float] = {}
        for e in table:
            t0 = time.perf_counter()
            per_test[e.name] = _lds(meas, e.scores(meas, chosen[e.name]))
            seconds[e.name] = time.perf_counter() - t0
        ref = list(per_test[REFERENCE])
        rows = []
        result: dict[str, Any] = {"chosen": chosen, "lds": {}, "ratio": {}, "difference": {}, "seconds": seconds}
        for e in table:
            lds = ev.mean_interval(per_test[e.name], args.seed)
            ratio = ev.ratio_interval(list(per_test[e.name]), ref, args.seed)
            result["lds"][e.name], result["ratio"][e.name] = lds, ratio
            rows.append([e.name, _cfg(chosen[e.name]) + (" (as explainq trak)" if e.tuned_as else ""),
                         _fmt(lds["mean"]), _iv(lds), str(lds["n"]),
                         "-" if e.name == REFERENCE else f"{_fmt(ratio['ratio'], 2)} {_iv(ratio, 2)}",
                         f"{seconds[e.name]:.1f}"])
        diffs = []
        for fam, theirs_fam in [*((f, f) for f in FAMILIES), ("trak_dense", "trak"), ("trak_former", "trak")]:
            ours = next(e for e in table if e.family == fam and e.library == "explainq")
            theirs = next(e for e in table if e.family == theirs_fam and e.library == "dattri")
            d = ef.difference_interval(list(per_test[ours.name]), list(per_test[theirs.name]), args.seed)
            result["difference"][fam] = d
            diffs.append([f"{ours.name} - {theirs.name}", _fmt(d["difference"]), _iv(d), str(d["n"]),
                          f"{seconds[ours.name]:.1f} / {seconds[theirs.name]:.1f}"])
        best = max((e.name for e in table if not e.name.startswith("(diagnostic)")),
                   key=lambda n: np.nanmean(per_test[n]))
        best_ratio = ev.ratio_interval(list(per_test[best]), ref, args.seed)
        ceiling = ev.noise_ceiling(meas.outputs, meas.again, args.seed)
        result["best"], result["ceiling"] = {"name": best, **best_ratio}, ceiling
        out += [f"Data attribution on digits (scikit-learn, 1,200 training images): MLP 64-32-10 exported and "
                f"trained by the service's trainer ({args.epochs} epochs, SGD lr {args.lr} momentum 0.9, batch 32, "
                f"checkpoints every {args.checkpoint_every} epochs: {len(meas.lrs)}), every model from the same "
                f"initial weights; LDS over m={args.m} subset models at alpha={args.alpha} on {args.n_test} test "
                f"examples (ground truth: each subset model's margin); tuned on a development replicate of "
                f"{args.m_dev} subset models and {args.n_dev} validation examples (its own full-data model); "
                "95% percentile bootstrap over test examples", "",
                "Development grid (LDS on the development replicate; the same number of settings per estimator "
                "in both libraries; TRAK's damping is a fraction of tr(K)/k in both)", ""]
        out += _table(["estimator", "setting", "dev LDS", "seconds", ""], grid_rows)
        out += ["", "Measurement (each estimator once, with its chosen setting); x TracIn: ratio of the mean LDS "
                f"to {REFERENCE}'s, paired bootstrap", ""]
        out += _table(["estimator", "setting", "LDS", "95% interval", "n", "x TracIn [95%]", "seconds"], rows)
        out += ["", "explainq - dattri, the same estimator on the same models (mean difference of the per-test "
                "LDS, paired bootstrap); seconds: explainq / dattri", ""]
        out += _table(["difference", "mean", "95% interval", "n", "seconds"], diffs)
        out += ["", f"Best estimator: {best}, {_fmt(best_ratio['ratio'], 2)} x {REFERENCE} "
                f"{_iv(best_ratio, 2)}; noise ceiling: replicate agreement "
                f"{_fmt(ceiling['agreement']['mean'])} {_iv(ceiling['agreement'])}, ceiling "
                f"{_fmt(ceiling['ceiling'])} (each subset model trained again with another seed)"]
        result["mislabel"] = {}
        if args.fraction > 0:
            out += [""] + mislabel(args, table, chosen, init, split, opts, work, result["mislabel"])
        out += [""] + PUBLISHED_CONTEXT
    result["lines"] = out
    return result


def mislabel(args: argparse.Namespace, table: list[Entry], chosen: dict[str, dict[str, Any]], init: Path,
             split: dict[str, Split], opts: TrainOptions, work: Path, aucs: dict[str, Any]) -> list[str]:
    labels, flipped = ef.flip_labels(split["train"].labels, len(DIGITS_LABELS), args.fraction, args.seed)
    data = Split(split["train"].inputs, labels)
    clf, states, lrs = _full(init, data, opts, ev.full_model_seed(args.seed, opts.seed), work / "mislabel")
    rep = Replicate("mislabel", args.seed, clf, states, lrs, data, split["test"], np.zeros((0, 0)), np.zeros((0, 0)))
    truth = np.zeros(len(labels), dtype=bool)
    truth[flipped] = True
    rows = []
    for e in table:
        if e.self_scores is None:
            continue
        t0 = time.perf_counter()
        s = e.self_scores(rep, chosen[e.name])
        secs = time.perf_counter() - t0
        if s.shape != truth.shape:
            raise AssertionError(f"{e.name}: self-influence of shape {s.shape} for {len(truth)} examples")
        auc = aucs[e.name] = ef.auc_interval(truth, np.nan_to_num(s, nan=-np.inf), args.seed)
        rows.append([e.name, _cfg(chosen[e.name]), _fmt(auc["auc"]), _iv(auc),
                     _fmt(ev.found_at(truth, s, 0.10)), _fmt(ev.found_at(truth, s, 0.20)), f"{secs:.1f}"])
    return ([f"Mislabel detection: {len(flipped)} of {len(labels)} training labels ({args.fraction:.0%}) flipped "
             "to another class, the recipe trained on them, self-influence ranked (AUC with a 95% bootstrap "
             "interval, positives and negatives resampled; found@q: share of the flipped labels among the top q)",
             ""] + _table(["estimator", "setting", "AUC", "95% interval", "found@10%", "found@20%", "seconds"], rows))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=64, help="subset models of the measurement (>= 50 for the issue)")
    ap.add_argument("--m-dev", type=int, default=24, help="subset models of the development replicate")
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--n-dev", type=int, default=100)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--ensemble", type=int, default=4, help="further full-data models of trak_ensemble (0: none)")
    ap.add_argument("--fraction", type=float, default=0.1, help="mislabel fraction (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dev-seed", type=int, default=1000, help="the development replicate's seed (all of its "
                    "seeds are derived from it, as the measurement's from --seed)")
    ap.add_argument("--init-seed", type=int, default=0, help="the initial weights every model starts from")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="a tiny run: m 6, m-dev 4, 12 test examples, 2 epochs")
    args = ap.parse_args(argv)
    for name in ("m", "m_dev", "n_test", "n_dev", "epochs", "checkpoint_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.quick:
        args.m, args.m_dev, args.n_test, args.n_dev, args.epochs, args.ensemble = 6, 4, 12, 10, 2, 1
        args.checkpoint_every = 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    t0 = time.perf_counter()
    print("\n".join(run(args)["lines"]))
    print(f"\n(total {time.perf_counter() - t0:.0f} s, torch threads {args.threads})")


if __name__ == "__main__":
    main()
