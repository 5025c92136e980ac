"""Crafted attribution and TracIn results, and the real dashboard's job page rendered from them (the router's own
context builders and templates), for tests that look at what the pages show without running a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.ui import router

STATIC = Path(router.HERE) / "static"
MODEL_A, MODEL_B = "nrms-a", "nrms-b"
JOB_ID = "0123456789abcdef0123456789abcdef"
LONG_WORD = "Supercalifragilisticexpialidocious" * 2  # one word wider than a phone


def record(sid: str, display: list[str], values: list[float], rel: float = 1e-4, label: str | None = "fake",
           history: list[str] | None = None, gap: bool = True) -> dict[str, Any]:
    """A sample record as ``models.news.attribution.explain`` writes it (spans over a text made of the words)."""
    spans, pos = [], 0
    for i, d in enumerate(display):
        if i and (gap and d not in ":,."):
            pos += 1
        spans.append([pos, pos + len(d)])
        pos += len(d)
    total = sum(values)
    return {"id": sid, "label": label, "words": [d.lower() for d in display], "display_words": display,
            "spans": spans, "word_attributions": values, "score": 2.0 + total, "baseline_score": 2.0,
            "attribution_sum": total * (1 + rel), "delta": total * rel, "relative_delta": rel,
            "history": history if history is not None else ["Senate passes the Budget bill", "Lakers win"],
            "top_positive": [], "top_negative": []}


def _summary(n: int, **extra: Any) -> dict[str, Any]:
    return {"n_samples": n, "n_errors": 0, "method": "gausslegendre", "n_steps": 64, "baseline": "pad",
            "median_relative_delta": 1e-4, **extra}


def attribution_result(n: int = 12, compare: bool = False, total: int | None = None) -> dict[str, Any]:
    """``n`` samples; sample s1 is "SHOCKING: Fans can't believe it" with the page's largest |attribution| (2.6);
    s2's completeness error is 0.42; the others end with a word wider than a phone; with ``compare`` a second
    model's records and per-sample changes. ``total``: the run attributed that many samples, of which the result
    holds these ``n`` inline (every one in ``samples.jsonl``). The result as ``AttributionResult`` validates it."""
    from core.contract.results.attributions import AttributionResult

    samples = [record("s1", ["SHOCKING", ":", "Fans", "can't", "believe", "it"], [2.6, 0.1, -0.4, 0.3, 1.2, -0.05]),
               record("s2", ["Senate", "passes", "budget"], [1.4, -0.7, 0.2], rel=0.42, label="real")]
    for i in range(3, n + 1):
        samples.append(record(f"s{i}", ["Lakers", "beat", "Celtics", "at", LONG_WORD], [0.1 * i / n, -0.2, 0.05, 0.0, 0.01],
                              label="real"))
    total = n if total is None else total
    deltas = {"median": 1e-4, "p95": 0.42, "max": 0.42}
    result: dict[str, Any] = {
        "model": MODEL_A, "n_samples": total, "n_errors": 0, "samples": samples, "errors": [],
        "warn_relative_delta": 0.05,
        "warnings": ["sample 's2': relative completeness error 0.42 (title) exceeds 0.05: its attributions do not "
                     "add up to score − baseline score; raise n_steps or set a tolerance"],
        "summary": _summary(total), "relative_delta": deltas, "relative_delta_by_view": {"title": deltas},
        "top_words": {"positive": [], "negative": [], "min_count": 3}, "word_stats": {},
        "labels": [["fake", 1], ["real", total - 1]], "artifacts": [],
        "listed": {"samples": {"total": total, "inline": len(samples), "artifact": "samples.jsonl"},
                   "errors": {"total": 0, "inline": 0, "artifact": "errors.jsonl"}},
    }
    if compare:
        from models.news.summary import ReportAccumulator, compare_sample
        from models.news.summary import compare as compare_acc

        other = [dict(r, word_attributions=[v * (1.5 if j % 2 else -1.0) for j, v in
                                            enumerate(r["word_attributions"])]) for r in samples]
        cmp = compare_acc(ReportAccumulator().extend(samples), ReportAccumulator().extend(other), 0.1, 3, 3)
        result["comparison"] = {
            "model": MODEL_B, **cmp, "changed_total": len(cmp["changed"]), "top_n": 2, "samples": other,
            "errors": [], "n_samples": total, "n_errors": 0,
            "per_sample": [compare_sample(a, b, 2) for a, b in zip(samples, other, strict=True)],
            "summary": _summary(total, median_relative_delta=2e-4), "relative_delta": deltas,
            "relative_delta_by_view": {"title": deltas}, "word_stats": {}}
        result["listed"].update({"comparison.samples": {"total": total, "inline": len(other),
                                                        "artifact": "compare.jsonl"},
                                 "comparison.errors": {"total": 0, "inline": 0, "artifact": "compare_errors.jsonl"}})
    return AttributionResult.model_validate(result).model_dump(mode="json")


def tracin_result(total: int | None = None) -> dict[str, Any]:
    """Mode test, two test triples: the first is itself a training triple (its own top proponent); influences in
    a narrow band (0.0138 to 0.0148), whose bars from zero are within 7 % of each other. ``total``: the run explained that
    many test triples, of which the result holds these two inline (every one in ``results.jsonl``). The result as
    ``InfluenceResult`` validates it."""
    from core.contract.results.influence import InfluenceResult

    t1, t2 = ["usa", "embassy", "uk"], ["china", "intergovorgs", "india"]
    props = [{"train_triple": t1, "influence": 0.0148, "train_self_influence": 0.02, "is_test_triple": True},
             {"train_triple": ["usa", "treaties", "uk"], "influence": 0.0143, "train_self_influence": 0.01},
             {"train_triple": ["uk", "embassy", "usa"], "influence": 0.0138, "train_self_influence": 0.01}]
    opps = [{"train_triple": ["usa", "boycottembargo", "cuba"], "influence": -0.002, "train_self_influence": 0.03},
            {"train_triple": ["uk", "boycottembargo", "cuba"], "influence": -0.001, "train_self_influence": 0.03}]
    entry = {"self_influence": 0.02, "n_candidates": 1500, "n_positive": 800, "n_negative": 700, "truncated": True}
    results = [{**entry, "test_triple": t1, "proponents": props, "opponents": opps, "in_train": True,
                "prediction": {"score": 3.25, "rank": 1.0, "n_entities": 14, "splits": ["train"]}},
               {**entry, "test_triple": t2, "proponents": props[1:], "opponents": opps, "in_train": False,
                "prediction": {"score": -1.5, "rank": 7.5, "n_entities": 14, "splits": ["test"]}}]
    total = len(results) if total is None else total
    return InfluenceResult.model_validate({
        "model": "conve-a", "mode": "test", "estimator": "tracin", "approximate": False, "top_k": 3,
        "checkpoints": [{"name": "e1", "epoch": 1, "lr": 0.01, "weight": 0.01}], "layers": ["ent", "fc"],
        "loss": "train", "filter": None, "artifacts": [], "n_test": total, "n_candidates": 1500,
        "results": results, "listed": {"results": {"total": total, "inline": len(results),
                                                   "artifact": "results.jsonl"}},
        "seconds": 1.0}).model_dump(mode="json")


def self_ranking_result(n: int, top_k: int | None = None) -> dict[str, Any]:
    """Mode self: ``n`` candidates ranked by self-influence, the first ``top_k`` (all: None) in the result, the
    whole ranking in ``self_influence.jsonl``."""
    from core.contract.results.influence import InfluenceResult

    ranking = [{"train_triple": ["a", "r", str(i)], "self_influence": 0.02 - i * 1e-4} for i in range(n)]
    inline = ranking if top_k is None else ranking[:top_k]
    return InfluenceResult.model_validate({
        "model": "conve-a", "mode": "self", "estimator": "tracin", "approximate": False, "top_k": top_k,
        "checkpoints": [{"name": "e1", "epoch": 1, "lr": 0.01, "weight": 0.01}], "layers": ["ent", "fc"],
        "loss": "train", "n_test": 0, "n_candidates": n, "ranking": inline,
        "listed": {"ranking": {"total": n, "inline": len(inline), "artifact": "self_influence.jsonl"}},
        "seconds": 1.0}).model_dump(mode="json")


def job_page(result: dict[str, Any], kind: str = "attributions", page: int = 1,
             options: dict[str, str] | None = None, artifacts: list[dict[str, Any]] | None = None,
             schema: str | None = None) -> str:
    """The job page the dashboard serves for a succeeded job with ``result`` (its schema header ``schema``), drawn
    by the renderer the kind names, through the router's own table of renderers."""
    renderer = {"attributions": "attributions", "tracin": "influence",
                "classifier_influence": "classifier_influence"}.get(kind, "classifier_evaluation"
                                                                          if kind.startswith("evaluate_classifier_")
                                                                          else "evaluation"
                                                                          if kind.startswith("evaluate_") else None)
    job = {"id": JOB_ID, "kind": kind, "status": "succeeded", "queue": "explain", "created_at": None,
           "started_at": None, "finished_at": None, "progress": {"done": 12, "total": 12, "unit": "samples"}}
    described = {"name": kind, "title": kind.replace("_", " ").capitalize(), "renderer": renderer, "route": None}
    ctx = router.page_context(router.PageInput(job, result, schema, described, artifacts or [], True, page,
                                               options or {}))
    ctx.update(user=None, auth_on=False, csrf_field="csrf_token", path=f"/ui/jobs/{JOB_ID}")
    return router.templates.get_template("job.html").render(ctx)


def tensor_result(kind: str, tmp_dir: Any, n: int = 3, compare: bool = False) -> dict[str, Any]:
    """A real exported classifier's attribution result (``image``: the 8x8 CNN, ``tabular``: the 6-feature MLP),
    computed by the pipeline and built by the job's own report builder, as the job page receives it."""
    import numpy as np

    from core.contract.results.attributions import AttributionResult
    from core.kinds.attributions import AttributionsRequest
    from models.export.attribution import TensorSample, explain
    from models.export.program import build
    from models.news.report import AttributionReport
    from tests.export_fixtures import save_model_dir
    from workers.jobs.attributions import _export_options, _part, _record, _report_options

    directory, _ = save_model_dir(tmp_dir / kind, kind)
    clf = build(directory / "model.pt2", __import__("json").loads((directory / "spec.json").read_text()))
    rng = np.random.default_rng(1)
    shape = clf.spec.shape
    items = [TensorSample(f"{kind}-{i}", rng.normal(size=shape), label=clf.labels[i % len(clf.labels)])
             for i in range(n)]
    request = AttributionsRequest(model=f"{kind}-model", inputs=[{"id": s.id, "values": s.values.tolist()}
                                                                  for s in items], n_steps=16, top_k=5,
                                  compare_with=f"{kind}-model-b" if compare else None)
    report = explain(clf, items, _export_options(request))
    report_b = explain(clf, items, _export_options(request)) if compare else None
    with AttributionReport(tmp_dir / f"{kind}-out", _report_options(request), _record) as out:
        out.part(_part(n, report, report_b, items, True), report["samples"],
                 report_b["samples"] if report_b is not None else ())
        result = out.finish()
    result["artifacts"] = []
    return AttributionResult.model_validate(result).model_dump(mode="json")
