r"""Which pixels or features made an exported classifier give this input this class?

The attributed function is the logit of one class (the *target*) of the program's output,
:math:`F(x) = \mathrm{logits}(x)_t`, with :math:`x` the program's input itself (Captum's ``IntegratedGradients``
on the input attributes the same function; a test checks they agree with the same baselines, steps and rule).

The engine (:mod:`models.explain.ig`) integrates over ``(N, L, D)`` tensors of *positions*: an image
``[C, H, W]`` is seen as its ``H·W`` pixels of ``C`` values each, a tabular row ``[F]`` as its ``F`` features of
one value. What a report calls a *word* is a cell: a pixel, or for images larger than :data:`MAX_GRID` pixels a
side a ``patch × patch`` square of pixels (the heatmap's resolution), or a named feature. A cell's attribution is
the sum of its values' attributions (over channels too), so the cells add up to the input's total, which IG makes
equal :math:`F(x) - F(x')` (completeness).

Baselines :math:`x'`: ``zero``; ``mean`` (the spec's training mean per channel or feature); ``blur`` (images: the
input blurred by a Gaussian of standard deviation :func:`blur_sigma` pixels, so edges and textures, not the overall
light, are what is explained); ``custom`` (one tensor of the input's shape, given with the request).

Faithfulness ranks the cells (IG, a seeded random order, occlusion: the score drop when one cell is set to the
baseline) and deletes or inserts them in that order (:mod:`models.explain.faithfulness`: comprehensiveness,
sufficiency, deletion and insertion curves against the random and occlusion floors).
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from models.common import resolve_precision
from models.explain.faithfulness import FRACTIONS, evaluate, random_order, rank_words
from models.explain.faithfulness import SampleWords as CellOrders
from models.explain.ig import IGResult, probe_bytes_per_row, rows_for_budget
from models.explain.rules import AttributionOptions
from models.explain.runs import ClassRun, attribute, integrate
from models.explain.runs import summary as run_summary
from models.export.program import ExportedClassifier
from models.hf.batches import item_target
from models.news.attribution import AttributionError, word_stats
from models.news.faithfulness import merged_section
from models.news.summary import ReportAccumulator

VIEW = "input"
BASELINES = ("zero", "mean", "blur", "custom")
TOKEN_BASELINES = ("pad", "mask")  # token inputs (models.export.tokens), with zero
MAX_GRID = 64  # heatmap cells a side at most; a larger image is drawn in patches
ProgressFn = Callable[[int, int, str], None]


@dataclass
class TensorSample:
    """One input to explain: its values (the spec's per-example shape), the caller's label, the class asked for
    (an index or a class name; None: the predicted class)."""

    id: str
    values: np.ndarray
    label: str | None = None
    target: int | str | None = None


@dataclass
class ExportOptions(AttributionOptions):
    """The attribution options of an exported classifier: every pipeline's, with its own baselines (``custom``
    takes ``baseline_values``, one input's values; ``pad`` and ``mask`` are for token inputs)."""

    BASELINES: ClassVar[tuple[str, ...]] = (*BASELINES, *TOKEN_BASELINES)
    baseline: str = "zero"
    baseline_values: np.ndarray | None = None


# ----------------------------------------------------------------------------------------- cells and layout
@dataclass
class Layout:
    """How one input is seen: positions ``L`` of ``D`` values, the cells (names and positions) and, for images,
    the heatmap grid."""

    kind: str
    shape: tuple[int, ...]
    cells: list[tuple[str, list[int]]]
    grid: tuple[int, int] | None = None
    patch: int | None = None

    @functools.cached_property
    def cell_index(self) -> np.ndarray:
        """Each position's cell (``[L]``), for summing positions into cells in one pass (built once per layout)."""
        index = np.empty(self.positions, dtype=np.int64)
        for k, (_, pos) in enumerate(self.cells):
            index[pos] = k
        return index

    def cell_sums(self, values: np.ndarray) -> np.ndarray:
        """``values`` per position (``[L]``) summed per cell."""
        if self.kind == "tabular" or self.patch == 1:
            return np.asarray(values, dtype=np.float64)  # one position per cell, in cell order
        return np.bincount(self.cell_index, weights=values, minlength=len(self.cells))

    @property
    def positions(self) -> int:
        return self.shape[1] * self.shape[2] if self.kind == "image" else self.shape[0]

    @property
    def depth(self) -> int:
        return self.shape[0] if self.kind == "image" else 1


def layout(clf: ExportedClassifier) -> Layout:
    spec = clf.spec
    if spec.kind == "tabular":
        return Layout("tabular", spec.shape, [(name, [i]) for i, name in enumerate(spec.features or [])])
    _, h, w = spec.shape
    patch = max(1, math.ceil(max(h, w) / MAX_GRID))
    rows, cols = math.ceil(h / patch), math.ceil(w / patch)
    cells = []
    for r in range(rows):
        for c in range(cols):
            pos = [y * w + x for y in range(r * patch, min(h, (r + 1) * patch))
                   for x in range(c * patch, min(w, (c + 1) * patch))]
            cells.append((f"r{r}c{c}" if patch == 1 else f"r{r}c{c}/{patch}px", pos))
    return Layout("image", spec.shape, cells, (rows, cols), patch)


def to_positions(x: torch.Tensor, lay: Layout) -> torch.Tensor:
    """``[N, *shape]`` -> ``(N, L, D)``."""
    if lay.kind == "image":
        n, c, h, w = x.shape
        return x.permute(0, 2, 3, 1).reshape(n, h * w, c)
    return x.reshape(x.shape[0], -1, 1)


def from_positions(e: torch.Tensor, lay: Layout) -> torch.Tensor:
    """``(N, L, D)`` -> ``[N, *shape]``."""
    if lay.kind == "image":
        c, h, w = lay.shape
        return e.reshape(e.shape[0], h, w, c).permute(0, 3, 1, 2)
    return e.reshape(e.shape[0], *lay.shape)


def blur_sigma(shape: Sequence[int]) -> float:
    """The blur baseline's Gaussian standard deviation in pixels: a sixteenth of the image's shorter side, at
    least one pixel."""
    return max(1.0, min(shape[-2:]) / 16)


def _blur(x: torch.Tensor) -> torch.Tensor:
    """Each channel blurred by a separable Gaussian (reflect padding, radius 3 sigma)."""
    sigma = blur_sigma(x.shape)
    h, w = x.shape[-2:]
    radius = max(1, min(int(3 * sigma), (min(h, w) - 1)))
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-t ** 2 / (2 * sigma ** 2))
    k = (k / k.sum()).to(x.dtype).to(x.device)
    n, c = x.shape[:2]
    y = x.reshape(n * c, 1, h, w)
    y = torch.nn.functional.pad(y, (radius, radius, 0, 0), mode="reflect")
    y = torch.nn.functional.conv2d(y, k.view(1, 1, 1, -1))
    y = torch.nn.functional.pad(y, (0, 0, radius, radius), mode="reflect")
    y = torch.nn.functional.conv2d(y, k.view(1, 1, -1, 1))
    return y.reshape(n, c, h, w)


def baselines(clf: ExportedClassifier, x: torch.Tensor, opts: ExportOptions) -> torch.Tensor:
    """The baseline of each input ``x`` ``[N, *shape]``."""
    if opts.baseline in TOKEN_BASELINES:
        raise ValueError(f"baseline {opts.baseline!r} is for token inputs; the model takes {clf.spec.kind} inputs")
    if opts.baseline == "zero":
        return torch.zeros_like(x)
    if opts.baseline == "mean":
        if clf.spec.mean is None:
            raise ValueError("baseline 'mean': the model's spec has no training mean (spec.input.mean)")
        m = torch.tensor(clf.spec.mean, dtype=x.dtype, device=x.device)
        shape = (1, -1, 1, 1) if clf.spec.kind == "image" else (1, -1)
        return m.view(shape).expand_as(x).clone()
    if opts.baseline == "blur":
        if clf.spec.kind != "image":
            raise ValueError("baseline 'blur' is for image inputs")
        return _blur(x)
    if opts.baseline_values is None:
        raise ValueError("baseline 'custom' needs baseline_values")
    b = torch.as_tensor(np.asarray(opts.baseline_values, dtype=np.float64), dtype=x.dtype, device=x.device)
    if tuple(b.shape) != tuple(x.shape[1:]):
        raise ValueError(f"baseline_values has shape {list(b.shape)}, the input {list(x.shape[1:])}")
    return b.unsqueeze(0).expand_as(x).clone()


# ---------------------------------------------------------------------------------------------- the batch
@dataclass
class Batch:
    """Inputs and baselines as ``(N, L, D)`` positions, the target of each row, and ``forward(e, rows)``: the
    target logit of row ``rows[i]`` for ``e[i]``."""

    clf: ExportedClassifier
    lay: Layout
    x: torch.Tensor
    base: torch.Tensor
    targets: torch.Tensor

    def forward(self, e: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        logits = self.clf.forward(from_positions(e, self.lay))
        return logits.gather(1, self.targets[rows.to(self.targets.device)].view(-1, 1).to(logits.device))[:, 0]

    @property
    def content(self) -> torch.Tensor:
        return torch.ones(self.x.shape[:2], dtype=torch.bool, device=self.x.device)


@dataclass
class Prepared:
    index: int
    sample: TensorSample
    target: int | None
    source: str


def prepare(clf: ExportedClassifier, samples: Sequence[TensorSample], errors: list[dict[str, Any]],
            targets: Mapping[str, str] | None = None) -> list[Prepared]:
    """Every input of the right shape and finite, with its class asked for (``targets``: the ``compare_with``
    pass's classes by name); the others become errors."""
    out = []
    for i, s in enumerate(samples):
        v = np.asarray(s.values)
        if tuple(v.shape) != tuple(clf.spec.shape):
            errors.append({"id": s.id, "error": f"values have shape {list(v.shape)}; the model takes "
                                                f"{list(clf.spec.shape)}"})
            continue
        if not np.isfinite(v).all():
            errors.append({"id": s.id, "error": "values must be finite (no NaN or infinity)"})
            continue
        try:
            target, source = item_target(clf.labels, s.id, s.target, targets)
        except ValueError as exc:
            errors.append({"id": s.id, "error": str(exc)})
            continue
        out.append(Prepared(i, s, target, source))
    return out


def build_batch(clf: ExportedClassifier, items: Sequence[Prepared], opts: ExportOptions, lay: Layout,
                fixed: Sequence[int] | None = None) -> tuple[Batch, list[dict[str, Any]], list[dict[str, Any]]]:
    """The batch of ``items`` with each target set (asked for, else predicted; ``fixed`` overrides), and the
    records' ``target`` and ``predicted``."""
    x = torch.as_tensor(np.stack([np.asarray(p.sample.values, dtype=np.float64) for p in items]),
                        dtype=torch.float32, device=clf.device)
    b = baselines(clf, x, opts)
    with torch.no_grad():
        lx = clf.forward(x).float()
    probs = torch.softmax(lx, dim=1)
    predicted = lx.argmax(1).tolist()
    chosen = list(fixed) if fixed is not None else [p.target if p.target is not None else predicted[j]
                                                    for j, p in enumerate(items)]
    batch = Batch(clf, lay, to_positions(x, lay), to_positions(b, lay),
                  torch.tensor(chosen, dtype=torch.long, device=clf.device))
    target_recs = [{"index": c, "label": clf.labels[c], "source": p.source} for p, c in zip(items, chosen,
                                                                                              strict=True)]
    predicted_recs = [{"index": c, "label": clf.labels[c], "probability": float(probs[j, c])}
                      for j, c in enumerate(predicted)]
    return batch, target_recs, predicted_recs


# program -> {(precision, device): bytes per interpolated row}, measured once per loaded model
_PROBES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _bytes_per_row(clf: ExportedClassifier, batch: Batch, precision: str) -> float:
    cache = _PROBES.setdefault(clf.program, {})
    key = (precision, str(clf.device))
    if key not in cache:
        cache[key] = probe_bytes_per_row(batch.forward, batch.x[:1], batch.base[:1], precision)
    return cache[key]


def _resolve_batches(clf: ExportedClassifier, batch: Batch, opts: ExportOptions, precision: str, n_steps: int,
                     n: int) -> tuple[int, int | None, int | None]:
    bs, abs_ = opts.batch_size, opts.alpha_batch_size
    if opts.method == "occlusion" or not opts.optimized:
        return max(1, min(n, n if bs == "auto" else int(bs))), None, None
    rows = None
    if bs == "auto" or abs_ == "auto":
        per_row = _bytes_per_row(clf, batch, precision)
        rows = rows_for_budget(per_row, clf.device, opts.memory_budget)
        if abs_ == "auto":
            abs_ = min(n_steps, rows) if bs == "auto" else max(1, min(n_steps, rows // int(bs)))
        if bs == "auto":
            bs = max(1, rows // int(abs_))
    return max(1, min(int(bs), n)), int(abs_), rows


def _occlusion_cells(batch: Batch, lay: Layout, max_rows: int = 256) -> torch.Tensor:
    """``(N, cells)`` score drops when one cell is set to the baseline (fp64)."""
    n = batch.x.shape[0]
    rows = torch.arange(n, device=batch.x.device)
    with torch.no_grad():
        full = batch.forward(batch.x, rows).double().cpu()
        masks = torch.zeros(len(lay.cells), batch.x.shape[1], dtype=torch.bool)
        for k, (_, pos) in enumerate(lay.cells):
            masks[k, pos] = True
        drops = torch.zeros(n, len(lay.cells), dtype=torch.float64)
        pairs = [(i, k) for i in range(n) for k in range(len(lay.cells))]
        for s in range(0, len(pairs), max_rows):
            part = pairs[s:s + max_rows]
            r = torch.tensor([i for i, _ in part], device=batch.x.device)
            m = masks[[k for _, k in part]].to(batch.x.device)
            e = torch.where(m[..., None], batch.base[r], batch.x[r])
            out = batch.forward(e, r).double().cpu()
            for j, (i, k) in enumerate(part):
                drops[i, k] = full[i] - out[j]
    return drops


def _integrate(batch: Batch, lay: Layout, opts: ExportOptions, n_steps: int, alpha_batch_size: int | None,
               rows: int | None, precision: str) -> IGResult:
    if opts.method == "occlusion":
        drops = _occlusion_cells(batch, lay)
        attr = torch.zeros(batch.x.shape[0], batch.x.shape[1], 1, dtype=torch.float64)
        for k, (_, pos) in enumerate(lay.cells):  # a cell's drop on its first position: the cell sums are right
            attr[:, pos[0], 0] = drops[:, k]
        r = torch.arange(batch.x.shape[0], device=batch.x.device)
        with torch.no_grad():
            fx = batch.forward(batch.x, r).float().cpu()
            fb = batch.forward(batch.base, r).float().cpu()
        return IGResult(attr.float(), fx, fb, len(lay.cells) + 2, "occlusion")
    return integrate(batch.forward, batch.x, batch.base, opts, n_steps, alpha_batch_size, rows, precision)


def _run(clf: ExportedClassifier, prepared: Sequence[Prepared], opts: ExportOptions, lay: Layout, precision: str,
         n_steps: int, progress: ProgressFn | None) -> ClassRun:
    first, _, _ = build_batch(clf, prepared[:1], opts, lay)
    batch_size, alpha_batch_size, rows = _resolve_batches(clf, first, opts, precision, n_steps, len(prepared))
    run = ClassRun(n_steps, batch_size, alpha_batch_size)
    for s in range(0, len(prepared), batch_size):
        items = prepared[s:s + batch_size]
        ids = [p.sample.id for p in items]
        try:
            batch, target_recs, predicted_recs = build_batch(clf, items, opts, lay)
            res = _integrate(batch, lay, opts, n_steps, alpha_batch_size, rows, precision)
        except (RuntimeError, ValueError) as exc:
            raise AttributionError(f"attribution failed for inputs {ids}: {exc}") from exc
        run.add(ids, res, target_recs, predicted_recs, "inputs")
        if progress is not None:
            done = min(len(prepared), s + batch_size)
            progress(done, len(prepared), f"{done}/{len(prepared)} inputs, n_steps={n_steps}")
    return run


# ------------------------------------------------------------------------------------------------ the report
def _input_view(p: Prepared, lay: Layout) -> dict[str, Any]:
    """What the page draws the attributions over: a tabular row's values, or an image's cells' mean intensity
    (over channels and the cell's pixels), row by row."""
    v = np.asarray(p.sample.values, dtype=np.float64)
    if lay.kind == "tabular":
        values = v.tolist()
    else:
        flat = v.reshape(v.shape[0], -1).mean(0)  # over channels, per pixel
        sizes = lay.cell_sums(np.ones_like(flat))
        values = (lay.cell_sums(flat) / sizes).tolist()
    return {"kind": lay.kind, "shape": list(lay.shape), "grid": list(lay.grid) if lay.grid else None,
            "patch": lay.patch, "values": values}


def _record(p: Prepared, run: ClassRun, opts: ExportOptions, lay: Layout) -> dict[str, Any]:
    sid = p.sample.id
    a = run.attr[sid]
    cells = lay.cell_sums(a).tolist()
    names = [n for n, _ in lay.cells]
    total = float(a.sum())
    score, base = run.scores[sid], run.baseline_scores[sid]
    ranked = sorted(zip(names, cells, strict=True), key=lambda t: -t[1])
    rec: dict[str, Any] = {
        "id": sid,
        "label": p.sample.label,
        "words": names,
        "word_attributions": cells,
        "score": score,
        "baseline_score": base,
        "attribution_sum": total,
        "delta": total - (score - base),
        "relative_delta": run.rel(sid),
        "top_positive": [{"word": w, "attribution": v} for w, v in ranked if v > 0][:opts.top_k],
        "top_negative": [{"word": w, "attribution": v} for w, v in reversed(ranked) if v < 0][:opts.top_k],
        "target": run.target[sid],
        "predicted": run.predicted[sid],
        "input": _input_view(p, lay),
    }
    if opts.adaptive:
        rec["n_steps"] = {VIEW: run.steps[sid]}
        rec["token_error"] = {VIEW: run.token_errors.get(sid)}
        rec["tolerance_met"] = run.converged[sid]
    return rec


def faithfulness_section(clf: ExportedClassifier, prepared: Sequence[Prepared], records: Sequence[dict[str, Any]],
                         opts: ExportOptions, lay: Layout, attribution_seconds: float,
                         chunk: int = 16) -> dict[str, Any]:
    """Add ``faithfulness`` to every record (cells deleted or inserted in IG's, a seeded random and occlusion's
    order, set to the same baseline IG integrated from) and return the run's summary of it."""
    t0, c0 = time.perf_counter(), time.process_time()
    by_id = {r["id"]: r for r in records}
    items = [p for p in prepared if p.sample.id in by_id]
    for s in range(0, len(items), chunk):
        part = items[s:s + chunk]
        recs = [by_id[p.sample.id] for p in part]
        batch, _, _ = build_batch(clf, part, opts, lay, [int(r["target"]["index"]) for r in recs])
        occ = _occlusion_cells(batch, lay).numpy()
        samples = [CellOrders([pos for _, pos in lay.cells],
                              {"ig": rank_words(rec["word_attributions"]),
                               "random": random_order(len(lay.cells), opts.faithfulness_seed, p.sample.id),
                               "occlusion": rank_words(occ[j])})
                   for j, (p, rec) in enumerate(zip(part, recs, strict=True))]
        results = evaluate(batch.forward, batch.x, batch.base, samples, FRACTIONS, reference=not opts.optimized)
        for rec, res in zip(recs, results, strict=True):
            rec["faithfulness"] = res
    every = [by_id[p.sample.id]["faithfulness"] for p in sorted(items, key=lambda p: p.index)]
    return merged_section(every, VIEW, opts.faithfulness_seed, opts.baseline, time.perf_counter() - t0,
                          time.process_time() - c0, attribution_seconds)


def explain(clf: ExportedClassifier, samples: Sequence[TensorSample], opts: ExportOptions | None = None,
            progress: ProgressFn | None = None, targets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Attribute each input's target logit to its cells; the report has the text pipelines' keys (``samples``,
    ``errors``, ``summary``, ``word_stats`` per cell or feature, and ``faithfulness`` when asked)."""
    opts = opts or ExportOptions()
    opts.check()
    if clf.spec.kind == "tokens":  # token ids: IG over the embedding table's output
        from models.export.tokens import explain as explain_tokens

        return explain_tokens(clf, samples, opts, progress, targets)
    started = time.perf_counter()
    precision = opts.pass_precision(resolve_precision(opts.precision, clf.device))
    lay = layout(clf)
    errors: list[dict[str, Any]] = []
    prepared = prepare(clf, samples, errors, targets)
    if prepared:
        baselines(clf, torch.zeros((1, *clf.spec.shape)), opts)  # ValueError for a baseline the model lacks
    prepare_seconds = time.perf_counter() - started
    att = attribute(opts, bool(prepared), lambda n: _run(clf, prepared, opts, lay, precision, n, progress))
    records = [_record(p, att.run, opts, lay) for p in prepared] if att.run is not None else []
    summary = run_summary(opts, precision, att, records, errors, started, prepare_seconds, VIEW,
                          ReportAccumulator(VIEW).extend(records).delta_by_view())
    report: dict[str, Any] = {"samples": records, "errors": errors, "summary": summary,
                              "word_stats": word_stats(records)}
    if opts.faithfulness and records:
        report["faithfulness"] = faithfulness_section(clf, prepared, records, opts, lay, summary["seconds"])
    return report
