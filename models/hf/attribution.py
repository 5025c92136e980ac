r"""Which words made a Hugging Face sequence classifier give this text this class?

The attributed function is the logit of one class (the *target*),

.. math:: F(e) = \mathrm{logits}(e)_t,

where :math:`e` is the output of the classifier's token-embedding table (``model.get_input_embeddings()``), passed
to the model as ``inputs_embeds``: everything after it is the real model in eval mode (position and token-type
embeddings, LayerNorm, every layer, the pooler and the classification head). Position and token-type embeddings
stay real on the whole path, which is what Captum's ``LayerIntegratedGradients(forward,
model.get_input_embeddings())`` attributes (a test checks the two agree, with the same baselines, steps and rule).

Target: per text a class index or a class name (``TextSample.target``), by default the class the model predicts
for the text (fp32 argmax of its logits); each record says which (``target``: index, label, ``source``) and gives the
predicted class with its softmax probability (``predicted``).

Baselines: ``pad`` (default) puts the tokenizer's padding token at every content position and passes it through the
same embedding table; ``mask`` the mask token (tokenizers that have one: BERT-family, RoBERTa); ``zero`` zero
vectors there. Structural tokens ([CLS], [SEP], or ``<s>``, ``</s>``) keep their real embedding in the baseline, so
their attribution is exactly zero and they are no word (as in :mod:`models.news.attribution`); ``[UNK]`` is content
like any word. Words are the fast tokenizer's word ids (:meth:`models.news.text.NewsTokenizer.group_words`); a
word's character span is trimmed of surrounding white space (byte-level BPE pieces carry their leading space), so
the words of two tokenizers over one text align (``compare_with``).

Batching: texts are grouped by token length and a batch holds texts of one length only, so nothing is ever padded
and every architecture's logits are exact (GPT-2's classifier reads the last position: with no padding it is the
text's last token, on the input and on the baseline alike). A text longer than the model's maximum is truncated to
it (``truncated`` in its record). Each batch is integrated by :mod:`models.explain.ig` with ``alpha_batch_size``
alphas per pass; ``"auto"`` sizes the passes from the model's measured memory per interpolated row.

The engine (:mod:`models.explain`) sees the model only through :class:`models.hf.batches.Batch`: the inputs ``x``
and baselines ``x'`` (embeddings) and ``forward(x, rows)``, the target logit of each row's text.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from models.common import resolve_precision
from models.explain.ig import (
    IGResult,
    probe_bytes_per_row,
    rows_for_budget,
)
from models.explain.occlusion import occlusion
from models.explain.records import view_record
from models.explain.rules import AttributionOptions
from models.explain.runs import ClassRun, attribute, integrate
from models.explain.runs import summary as run_summary
from models.hf.batches import (
    BASELINES,
    VIEW,
    Batch,
    Prepared,
    TextSample,
    baseline_token,
    build_batch,
    length_batches,
    logits_from_embeddings,
    max_tokens,
    prepare,
    trimmed_spans,
)
from models.hf.checkpoint import HFClassifier
from models.news.attribution import AttributionError, length_bucket, word_stats
from models.news.summary import ReportAccumulator

__all__ = ["HFOptions", "TextSample", "explain", "input_state", "length_batches", "max_tokens", "prepare"]


ProgressFn = Callable[[int, int, str], None]


@dataclass
class HFOptions(AttributionOptions):
    """The attribution options of a text classifier: every pipeline's, and a mask-token baseline too."""

    BASELINES: ClassVar[tuple[str, ...]] = BASELINES


# ------------------------------------------------------------------------------------------------- the run
# transformers model -> {(precision, device, length bucket): bytes per interpolated row}
_PROBES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _bytes_per_row(clf: HFClassifier, length: int, precision: str,
                   logits: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """Memory per interpolated row for texts up to ``length``'s bucket (the next power of two, capped at the
    model's maximum), probed once per model, precision, device and bucket."""
    bucket = max(length, min(length_bucket(length), max_tokens(clf)))
    key = (precision, str(clf.device), bucket)
    cache = _PROBES.setdefault(clf.model, {})
    if key not in cache:
        with torch.no_grad():
            x0 = clf.embeddings()(torch.zeros(1, bucket, dtype=torch.long, device=clf.device)).float()

        def forward(xs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            return logits(xs)[:, 0].float()

        cache[key] = probe_bytes_per_row(forward, x0, torch.zeros_like(x0), precision)
    return cache[key]


def _resolve_batches(clf: HFClassifier, prepared: Sequence[Prepared], opts: HFOptions, precision: str,
                     n_steps: int, logits: Callable[[torch.Tensor], torch.Tensor]
                     ) -> tuple[int, int | None, int | None]:
    """(batch_size, alpha_batch_size, rows per pass within the memory budget (None when nothing is auto))."""
    bs, abs_ = opts.batch_size, opts.alpha_batch_size
    if opts.method == "occlusion" or not opts.optimized:
        return max(1, min(len(prepared), len(prepared) if bs == "auto" else int(bs))), None, None
    rows = None
    if bs == "auto" or abs_ == "auto":
        per_row = _bytes_per_row(clf, max(len(p.ids) for p in prepared), precision, logits)
        rows = rows_for_budget(per_row, clf.device, opts.memory_budget)
        if abs_ == "auto":
            abs_ = min(n_steps, rows) if bs == "auto" else max(1, min(n_steps, rows // int(bs)))
        if bs == "auto":
            bs = max(1, rows // int(abs_))
    return max(1, min(int(bs), len(prepared))), int(abs_), rows


def _classes(clf: HFClassifier, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, Any]],
                                                         list[dict[str, Any]]]:
    """Set each text's target class (asked for, or predicted) and return (F(x), F(x')) of the targets (fp64) and
    the records' ``target`` and ``predicted``."""
    lx, lb = batch.endpoint_logits()
    probs = torch.softmax(lx, dim=1)
    predicted = lx.argmax(1).tolist()
    targets = [p.target if p.target is not None else predicted[j] for j, p in enumerate(batch.items)]
    batch.targets = torch.tensor(targets, dtype=torch.long, device=batch.x.device)
    rows = torch.arange(len(targets))
    t = torch.tensor(targets)
    target_recs = [{"index": c, "label": clf.labels[c], "source": p.target_source}
                   for p, c in zip(batch.items, targets, strict=True)]
    predicted_recs = [{"index": c, "label": clf.labels[c], "probability": float(probs[j, c])}
                      for j, c in enumerate(predicted)]
    return lx[rows, t], lb[rows, t], target_recs, predicted_recs


def _integrate(batch: Batch, opts: HFOptions, n_steps: int, alpha_batch_size: int | None, rows: int | None,
               precision: str, fx: torch.Tensor, fb: torch.Tensor) -> IGResult:
    """Occlusion, the reference loop, IG refined per text until ``opts.tolerance``, or IG at ``n_steps``."""
    if opts.method == "occlusion":
        return occlusion(batch.forward, batch.x, batch.base, batch.content)
    return integrate(batch.forward, batch.x, batch.base, opts, n_steps, alpha_batch_size, rows, precision,
                     endpoint_scores=(fx, fb))


def _run(clf: HFClassifier, prepared: Sequence[Prepared], opts: HFOptions, precision: str, n_steps: int,
         progress: ProgressFn | None) -> ClassRun:
    """Every prepared text, batch by batch."""
    logits = logits_from_embeddings(clf)
    batch_size, alpha_batch_size, rows = _resolve_batches(clf, prepared, opts, precision, n_steps, logits)
    run = ClassRun(n_steps, batch_size, alpha_batch_size)
    done = 0
    for items in length_batches(prepared, batch_size):
        ids = [p.sample.id for p in items]
        try:
            batch = build_batch(clf, items, opts.baseline, logits)
            fx, fb, target_recs, predicted_recs = _classes(clf, batch)
            res = _integrate(batch, opts, n_steps, alpha_batch_size, rows, precision, fx, fb)
        except (RuntimeError, ValueError) as exc:
            raise AttributionError(f"attribution failed for texts {ids}: {exc}") from exc
        run.add(ids, res, target_recs, predicted_recs, "texts")
        done += len(items)
        if progress is not None:
            progress(done, len(prepared), f"{done}/{len(prepared)} texts, n_steps={n_steps}")
    return run


# ------------------------------------------------------------------------------------------------ the report
def _record(p: Prepared, run: ClassRun, opts: HFOptions) -> dict[str, Any]:
    """One text's record, in the news records' shape (``core.contract.results.attributions.SampleRecord``)."""
    sid = p.sample.id
    rec: dict[str, Any] = {
        "id": sid,
        "label": p.sample.label,
        **view_record(p.sample.text, p.tokens, run.attr[sid], p.words,
                      trimmed_spans(p.sample.text, p.words, p.offsets), run.scores[sid], run.baseline_scores[sid],
                      float(run.attr[sid].sum()), run.rel(sid), opts.top_k),
        "target": run.target[sid],
        "predicted": run.predicted[sid],
        "truncated": p.truncated,
    }
    if opts.adaptive:
        rec["n_steps"] = {VIEW: run.steps[sid]}
        rec["token_error"] = {VIEW: run.token_errors.get(sid)}
        rec["tolerance_met"] = run.converged[sid]
    return rec


def explain(clf: HFClassifier, samples: Sequence[TextSample], opts: HFOptions | None = None,
            progress: ProgressFn | None = None, targets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Attribute each text's target logit to its words. Returns the JSON-ready report: ``samples`` (one record per
    attributed text, in the request's order), ``errors`` (texts that could not be attributed, with the reason),
    ``summary`` and ``word_stats``, and with ``opts.faithfulness`` the ``faithfulness`` section
    (:mod:`models.hf.faithfulness`). ``targets`` (text id -> class name) overrides the texts' own targets (the
    ``compare_with`` pass). A NaN or infinite attribution or score raises ``NonFiniteError`` naming the texts."""
    opts = opts or HFOptions()
    opts.check()
    baseline_token(clf, opts.baseline)  # ValueError when the tokenizer has no such token
    started = time.perf_counter()
    precision = opts.pass_precision(resolve_precision(opts.precision, clf.device))
    errors: list[dict[str, Any]] = []
    prepared = prepare(clf, samples, errors, targets)
    prepare_seconds = time.perf_counter() - started
    att = attribute(opts, bool(prepared), lambda n: _run(clf, prepared, opts, precision, n, progress))
    records = [_record(p, att.run, opts) for p in prepared] if att.run is not None else []
    position = {s.id: i for i, s in enumerate(samples)}
    errors.sort(key=lambda e: position.get(e["id"], len(position)))
    summary = run_summary(opts, precision, att, records, errors, started, prepare_seconds, VIEW,
                          ReportAccumulator(VIEW).extend(records).delta_by_view())
    report: dict[str, Any] = {"samples": records, "errors": errors, "summary": summary,
                              "word_stats": word_stats(records)}
    if opts.faithfulness and records:
        from models.hf.faithfulness import faithfulness_section

        def faith_progress(done: int, total: int) -> None:
            if progress is not None:
                progress(len(prepared), len(prepared), f"faithfulness: {done}/{total} texts")

        report["faithfulness"] = faithfulness_section(clf, prepared, records, opts.baseline, opts.faithfulness_seed,
                                                      summary["seconds"], reference=not opts.optimized,
                                                      progress=faith_progress)
    return report


def input_state(samples: Sequence[TextSample]) -> dict[str, Any]:
    """The input warnings' state of a part (``models.news.summary.InputWarnings.state``): whether any text has a
    label; texts have no bodies to miss."""
    from models.news.summary import InputWarnings

    state = InputWarnings().state()
    state["labelled"] = any(s.label is not None for s in samples)
    return state
