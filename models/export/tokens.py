r"""Which tokens made an exported text classifier give these ids this class?

The attributed function is the logit of one class (the *target*) with the program's embedding call replaced:
:math:`F(e) = \mathrm{logits}(\mathrm{ids}, e)_t`, where :math:`e` is what the spec's embedding table gives for the
ids (``input.embedding``, the one ``aten.embedding.default`` call that reads it with the ids,
:func:`models.export.spec.embedding_node`). The service's interpreter runs the program on the real ids with that
call's output replaced by the interpolated embeddings (``Program.forward(..., replace=...)``), so every other node
(position embeddings, an attention mask computed from the ids, a tied output layer) sees what it sees in the
eager model. That is what Captum's ``LayerIntegratedGradients(forward, model.embedding)`` attributes (a test
checks the two agree, with the same baselines, steps and rule); a token's attribution is the sum over the
embedding dimension.

Baselines: ``pad`` (the spec's ``pad_id``) or ``mask`` (its ``mask_id``) at every content position, passed through
the same table, or ``zero`` vectors there. Positions holding ``pad_id`` (padding) or one of ``special_ids`` ([CLS]
and the like) keep their real embedding in every baseline: their attribution is exactly zero and they are no word.
With an attention mask, the service fills it from the ids (0 where they hold ``pad_id``) for the input, the
baseline and every point between alike.

Words: the vocabulary's tokens (``#<id>`` without one), a token starting with ``##`` continuing the word before it
(WordPiece); the record's text is the words joined by spaces, and its spans point into it. Inputs of one length
share a batch (a dynamic-length program is never padded by the service). Records, faithfulness (token deletion:
words set to the baseline in IG's, a seeded random and occlusion's order) and the summary are the Hugging Face
classifiers' (:mod:`models.hf.attribution`), in the one view ``text``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from models.common import resolve_precision
from models.explain.faithfulness import FRACTIONS, evaluate, sample_words
from models.explain.ig import IGResult, probe_bytes_per_row, rows_for_budget
from models.explain.occlusion import occlusion
from models.explain.records import view_record
from models.explain.rules import AttributionOptions
from models.explain.runs import ClassRun, attribute, integrate
from models.explain.runs import summary as run_summary
from models.export.program import ExportedClassifier
from models.hf.batches import item_target, length_batches
from models.news.attribution import AttributionError, word_stats
from models.news.faithfulness import merged_section
from models.news.summary import ReportAccumulator
from models.news.text import NewsTokenizer

VIEW = "text"
BASELINES = ("pad", "mask", "zero")
CHUNK_SAMPLES = 32  # inputs whose faithfulness variants are built and scored together
ProgressFn = Callable[[int, int, str], None]


class _Pieces(NewsTokenizer):
    """The news pipeline's word grouping without word ids: ``##`` pieces continue the word before them."""

    continuation_prefix = "##"

    def __init__(self, structural: frozenset[int]) -> None:
        self.special_ids = structural
        self.pad_id = -1


@dataclass
class Prepared:
    """One input's ids, its tokens as the vocabulary names them, which positions are content, its words (token
    positions each), its text (the words joined by spaces) and each word's span there, and the class asked for."""

    index: int
    sample: Any  # models.export.attribution.TensorSample
    ids: list[int]
    tokens: list[str]
    content: list[bool]
    words: list[tuple[str, list[int]]]
    text: str
    spans: list[tuple[int, int]]
    target: int | None
    source: str


def token_name(clf: ExportedClassifier, tid: int) -> str:
    words = clf.spec.tokens.words  # type: ignore[union-attr]
    return words[tid] if words is not None else f"#{tid}"


def ids_problem(values: Any, tok: Any) -> str | None:
    """Why ``values`` are not token ids the model reads (a list of integers of its length, each a row of its
    table), or None."""
    v = np.asarray(values)
    if v.ndim != 1 or not (np.issubdtype(v.dtype, np.integer) or (np.issubdtype(v.dtype, np.floating)
                                                                    and np.isfinite(v).all()
                                                                    and (v == np.round(v)).all())):
        return "values must be a list of token ids (integers)"
    if tok.dynamic and not tok.min_tokens <= len(v) <= tok.max_tokens:
        return f"values have {len(v)} tokens; the model reads {tok.min_tokens} to {tok.max_tokens}"
    if not tok.dynamic and len(v) != tok.max_tokens:
        return f"values have {len(v)} tokens; the model reads exactly {tok.max_tokens} (pad with pad_id)"
    bad = np.flatnonzero((v < 0) | (v >= tok.vocab_size))
    if bad.size:
        return f"values[{int(bad[0])}] is {v[bad[0]]}, not a token id of the vocabulary (0..{tok.vocab_size - 1})"
    return None


def prepare(clf: ExportedClassifier, samples: Sequence[Any], errors: list[dict[str, Any]],
            targets: Mapping[str, str] | None = None) -> list[Prepared]:
    """Every input of token ids the model reads, with its words and class asked for; the others become errors."""
    tok = clf.spec.tokens
    structural = frozenset(([tok.pad_id] if tok.pad_id is not None else []) + list(tok.special_ids))
    pieces = _Pieces(structural)
    out = []
    for i, s in enumerate(samples):
        problem = ids_problem(s.values, tok)
        if problem is not None:
            errors.append({"id": s.id, "error": problem})
            continue
        ids = [int(t) for t in np.asarray(s.values).tolist()]
        content = [t not in structural for t in ids]
        if not any(content):
            errors.append({"id": s.id, "error": "values hold no token but padding and special ids"})
            continue
        try:
            target, source = item_target(clf.labels, s.id, s.target, targets)
        except ValueError as exc:
            errors.append({"id": s.id, "error": str(exc)})
            continue
        tokens = [token_name(clf, t) for t in ids]
        words = pieces.group_words(tokens, ids)
        spans, at = [], 0
        for w, _ in words:
            spans.append((at, at + len(w)))
            at += len(w) + 1
        out.append(Prepared(i, s, ids, tokens, content, words, " ".join(w for w, _ in words), spans, target,
                            source))
    return out


@dataclass
class Batch:
    """Inputs of one length: ids ``(n, L)``, embeddings ``x`` and baselines ``base`` ``(n, L, D)`` (fp32), the
    content positions, each input's target and ``forward(e, rows)``: the target logit of row ``rows[i]``'s ids with
    embeddings ``e[i]``."""

    clf: ExportedClassifier
    ids: torch.Tensor
    x: torch.Tensor
    base: torch.Tensor
    content: torch.Tensor
    targets: torch.Tensor

    def forward(self, e: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.to(self.ids.device)
        out = self.clf.forward_embedded(self.ids[rows], e)
        return out.gather(1, self.targets[rows].view(-1, 1).to(out.device))[:, 0].float()


def build_batch(clf: ExportedClassifier, items: Sequence[Prepared], baseline: str,
                fixed: Sequence[int] | None = None) -> tuple[Batch, list[dict[str, Any]], list[dict[str, Any]]]:
    """The batch of ``items`` (one length) with each target set (asked for, else predicted; ``fixed`` overrides),
    and the records' ``target`` and ``predicted``."""
    tok = clf.spec.tokens
    lengths = {len(p.ids) for p in items}
    if len(lengths) != 1:
        raise ValueError(f"a batch holds inputs of one length, got {sorted(lengths)}")
    dev = clf.device
    ids = torch.tensor([p.ids for p in items], dtype=torch.long, device=dev)
    content = torch.tensor([p.content for p in items], dtype=torch.bool, device=dev)
    with torch.no_grad():
        x = clf.embed(ids).float()
        if baseline == "zero":
            base = torch.where(content[..., None], torch.zeros_like(x), x)
        else:
            token = tok.pad_id if baseline == "pad" else tok.mask_id
            if token is None:
                raise ValueError(f"baseline {baseline!r}: the model's spec declares no {baseline}_id")
            base = clf.embed(torch.where(content, torch.full_like(ids, token), ids)).float()
        lx = clf.forward_embedded(ids, x).float()
    probs = torch.softmax(lx, dim=1)
    predicted = lx.argmax(1).tolist()
    chosen = list(fixed) if fixed is not None else [p.target if p.target is not None else predicted[j]
                                                    for j, p in enumerate(items)]
    batch = Batch(clf, ids, x, base, content, torch.tensor(chosen, dtype=torch.long, device=dev))
    target_recs = [{"index": c, "label": clf.labels[c], "source": p.source} for p, c in zip(items, chosen,
                                                                                              strict=True)]
    predicted_recs = [{"index": c, "label": clf.labels[c], "probability": float(probs[j, c])}
                      for j, c in enumerate(predicted)]
    return batch, target_recs, predicted_recs


def check_baseline(clf: ExportedClassifier, baseline: str) -> None:
    """ValueError for a baseline the model's spec cannot give."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline {baseline!r} is not for token inputs; a text model takes "
                         f"{', '.join(BASELINES)}")
    tok = clf.spec.tokens
    if baseline in ("pad", "mask") and getattr(tok, f"{baseline}_id") is None:
        raise ValueError(f"baseline {baseline!r}: the model's spec declares no {baseline}_id")


# program -> {(precision, device, length, baseline): bytes per interpolated row}, probed once per loaded model
_PROBES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _bytes_per_row(clf: ExportedClassifier, longest: Prepared, baseline: str, precision: str) -> float:
    key = (precision, str(clf.device), len(longest.ids), baseline)
    cache = _PROBES.setdefault(clf.program, {})
    if key not in cache:
        probe, _, _ = build_batch(clf, [longest], baseline)
        cache[key] = probe_bytes_per_row(probe.forward, probe.x, probe.base, precision)
    return cache[key]


def _resolve_batches(clf: ExportedClassifier, prepared: Sequence[Prepared], opts: AttributionOptions,
                     precision: str, n_steps: int) -> tuple[int, int | None, int | None]:
    bs, abs_ = opts.batch_size, opts.alpha_batch_size
    if opts.method == "occlusion" or not opts.optimized:
        return max(1, min(len(prepared), len(prepared) if bs == "auto" else int(bs))), None, None
    rows = None
    if bs == "auto" or abs_ == "auto":
        per_row = _bytes_per_row(clf, max(prepared, key=lambda p: len(p.ids)), opts.baseline, precision)
        rows = rows_for_budget(per_row, clf.device, opts.memory_budget)
        if abs_ == "auto":
            abs_ = min(n_steps, rows) if bs == "auto" else max(1, min(n_steps, rows // int(bs)))
        if bs == "auto":
            bs = max(1, rows // int(abs_))
    return max(1, min(int(bs), len(prepared))), int(abs_), rows


def _integrate(batch: Batch, opts: AttributionOptions, n_steps: int, alpha_batch_size: int | None,
               rows: int | None, precision: str) -> IGResult:
    if opts.method == "occlusion":
        return occlusion(batch.forward, batch.x, batch.base, batch.content)
    return integrate(batch.forward, batch.x, batch.base, opts, n_steps, alpha_batch_size, rows, precision)


def _run(clf: ExportedClassifier, prepared: Sequence[Prepared], opts: AttributionOptions, precision: str,
         n_steps: int, progress: ProgressFn | None) -> ClassRun:
    batch_size, alpha_batch_size, rows = _resolve_batches(clf, prepared, opts, precision, n_steps)
    run = ClassRun(n_steps, batch_size, alpha_batch_size)
    done = 0
    for items in length_batches(prepared, batch_size):  # type: ignore[arg-type]
        ids = [p.sample.id for p in items]
        try:
            batch, target_recs, predicted_recs = build_batch(clf, items, opts.baseline)
            res = _integrate(batch, opts, n_steps, alpha_batch_size, rows, precision)
        except (RuntimeError, ValueError) as exc:
            raise AttributionError(f"attribution failed for inputs {ids}: {exc}") from exc
        run.add(ids, res, target_recs, predicted_recs, "inputs")
        done += len(items)
        if progress is not None:
            progress(done, len(prepared), f"{done}/{len(prepared)} inputs, n_steps={n_steps}")
    return run


def _record(p: Prepared, run: ClassRun, opts: AttributionOptions) -> dict[str, Any]:
    sid = p.sample.id
    rec: dict[str, Any] = {
        "id": sid,
        "label": p.sample.label,
        **view_record(p.text, p.tokens, run.attr[sid], p.words, p.spans, run.scores[sid],
                      run.baseline_scores[sid], float(run.attr[sid].sum()), run.rel(sid), opts.top_k),
        "target": run.target[sid],
        "predicted": run.predicted[sid],
        "truncated": False,
    }
    if opts.adaptive:
        rec["n_steps"] = {VIEW: run.steps[sid]}
        rec["token_error"] = {VIEW: run.token_errors.get(sid)}
        rec["tolerance_met"] = run.converged[sid]
    return rec


def faithfulness_section(clf: ExportedClassifier, prepared: Sequence[Prepared], records: Sequence[dict[str, Any]],
                         opts: AttributionOptions, attribution_seconds: float) -> dict[str, Any]:
    """Add ``faithfulness`` to every record (words set to the baseline IG integrated from, in IG's, a seeded random
    and occlusion's order) and return the run's summary of it."""
    t0, c0 = time.perf_counter(), time.process_time()
    by_id = {r["id"]: r for r in records}
    items = [p for p in prepared if p.sample.id in by_id]
    for part in length_batches(items, CHUNK_SAMPLES):  # type: ignore[arg-type]
        recs = [by_id[p.sample.id] for p in part]
        batch, _, _ = build_batch(clf, part, opts.baseline, [int(r["target"]["index"]) for r in recs])
        occ = occlusion(batch.forward, batch.x, batch.base, batch.content).attributions[..., 0].double().cpu()
        samples = [sample_words(f"input {p.sample.id!r}", p.sample.id, [pos for _, pos in p.words],
                                rec["word_attributions"], occ[j], opts.faithfulness_seed)
                   for j, (p, rec) in enumerate(zip(part, recs, strict=True))]
        results = evaluate(batch.forward, batch.x, batch.base, samples, FRACTIONS, reference=not opts.optimized)
        for rec, res in zip(recs, results, strict=True):
            rec["faithfulness"] = res
    every = [by_id[p.sample.id]["faithfulness"] for p in sorted(items, key=lambda p: p.index)]
    return merged_section(every, VIEW, opts.faithfulness_seed, opts.baseline, time.perf_counter() - t0,
                          time.process_time() - c0, attribution_seconds)


def explain(clf: ExportedClassifier, samples: Sequence[Any], opts: AttributionOptions,
            progress: ProgressFn | None = None, targets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Attribute each input's target logit to its tokens and words; the report of
    :func:`models.hf.attribution.explain` (``samples``, ``errors``, ``summary``, ``word_stats``, ``faithfulness``
    when asked)."""
    check_baseline(clf, opts.baseline)
    started = time.perf_counter()
    precision = opts.pass_precision(resolve_precision(opts.precision, clf.device))
    errors: list[dict[str, Any]] = []
    prepared = prepare(clf, samples, errors, targets)
    prepare_seconds = time.perf_counter() - started
    att = attribute(opts, bool(prepared), lambda n: _run(clf, prepared, opts, precision, n, progress))
    records = [_record(p, att.run, opts) for p in prepared] if att.run is not None else []
    summary = run_summary(opts, precision, att, records, errors, started, prepare_seconds, VIEW,
                          ReportAccumulator(VIEW).extend(records).delta_by_view())
    report: dict[str, Any] = {"samples": records, "errors": errors, "summary": summary,
                              "word_stats": word_stats(records)}
    if opts.faithfulness and records:
        report["faithfulness"] = faithfulness_section(clf, prepared, records, opts, summary["seconds"])
    return report
