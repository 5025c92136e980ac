"""Two succeeded jobs of one kind side by side (``GET /compare``): the pure comparison of their results and the
bounded read of the lists a result holds in part (``core.contract.results.compare`` documents the answer).

Everything here is plain Python over the results' JSON (no torch, no numpy): ranks, Spearman's rho (Pearson's
correlation of average ranks) and Kendall's tau-b (O(n log n), Knight's algorithm), checked in the tests against
``scipy.stats``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from core.contract.results.compare import (
    AttributionComparison,
    ComparedJob,
    ComparisonResult,
    FieldDelta,
    InfluenceComparison,
    ListComparison,
    MetricDelta,
    RankedTriple,
    SampleDelta,
    TestComparison,
    TrainingComparison,
    VocabularyDelta,
    WordDelta,
)

COMPARED_RENDERERS = ("attributions", "influence", "training")
READ_LIMIT = 5000  # records (attribution samples, TracIn test triples) read per job, inline and from the artifact
READ_MAX_BYTES = 64 << 20  # bytes read per job from a listed artifact
LIST_COMPARED = 1000  # entries of one ranked list compared (a TracIn top_k may be 10,000)
SAMPLES_INLINE = 200  # matched samples the answer holds, with their words
WORDS_INLINE = 500  # vocabulary words the answer holds, by the size of their change
ONLY_INLINE = 100  # ids (or test triples) of one job only that the answer names


class CompareRefused(ValueError):
    """The two jobs cannot be compared (``field``: the query parameter to name in the 422)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


# ------------------------------------------------------------------------------------------------ statistics
def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of ``values`` in ascending order, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    n = len(x)
    if n < 2:
        return None
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return None  # a constant side: no correlation is defined
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the average ranks; None with fewer than 2 pairs or a constant
    side."""
    return _pearson(average_ranks(x), average_ranks(y))


def _ties(sorted_values: Sequence[Any]) -> int:
    """Pairs tied in an already sorted sequence: sum of t(t-1)/2 over runs of equal values."""
    total, run = 0, 1
    for i in range(1, len(sorted_values) + 1):
        if i < len(sorted_values) and sorted_values[i] == sorted_values[i - 1]:
            run += 1
        else:
            total += run * (run - 1) // 2
            run = 1
    return total


def _inversions(values: list[float]) -> tuple[list[float], int]:
    """``values`` sorted and the number of strictly inverted pairs (merge sort)."""
    if len(values) < 2:
        return values, 0
    mid = len(values) // 2
    left, n_left = _inversions(values[:mid])
    right, n_right = _inversions(values[mid:])
    merged: list[float] = []
    swaps, i, j = n_left + n_right, 0, 0
    while i < len(left) and j < len(right):
        if right[j] < left[i]:
            merged.append(right[j])
            swaps += len(left) - i
            j += 1
        else:
            merged.append(left[i])
            i += 1
    merged.extend(left[i:])
    merged.extend(right[j:])
    return merged, swaps


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b, (concordant − discordant) / sqrt((n0 − ties_x)(n0 − ties_y)), in O(n log n): sorted by
    (x, y), the discordant pairs are the inversions of y. None with fewer than 2 pairs or a constant side."""
    n = len(x)
    if n < 2:
        return None
    pairs = sorted(zip(x, y, strict=True))
    n0 = n * (n - 1) // 2
    ties_x = _ties([p[0] for p in pairs])
    ties_xy = _ties(pairs)
    ys = [p[1] for p in pairs]
    sorted_y, discordant = _inversions(ys)
    ties_y = _ties(sorted_y)
    if n0 == ties_x or n0 == ties_y:
        return None
    numerator = n0 - ties_x - ties_y + ties_xy - 2 * discordant
    return max(-1.0, min(1.0, numerator / math.sqrt((n0 - ties_x) * (n0 - ties_y))))


def _rank_desc(values: Sequence[float | None]) -> list[int | None]:
    """Competition ranks, 1 for the largest; None for a missing value (ranked nowhere)."""
    present = sorted((v for v in values if v is not None), reverse=True)
    first: dict[float, int] = {}
    for i, v in enumerate(present):
        first.setdefault(v, i + 1)
    return [None if v is None else first[v] for v in values]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
        value) else None


def _sub(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None else b - a


# -------------------------------------------------------------------------------------------------- reading
def listed_entries(result: dict[str, Any], field: str, read_artifact: Any, limit: int = READ_LIMIT,
                   listed_name: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """The first ``limit`` entries of the result's list ``field`` and how many the run has: those inline, or, when
    the result holds the list in part (``listed``), read from its JSONL artifact through ``read_artifact(name)``
    (an iterable of lines, bounded by the caller)."""
    inline = [e for e in result.get(field) or [] if isinstance(e, dict)]
    listed = (result.get("listed") or {}).get(listed_name or field) or {}
    total = int(listed.get("total") or len(inline))
    artifact = listed.get("artifact")
    if total <= len(inline) or not artifact or len(inline) >= limit:
        return inline[:limit], max(total, len(inline))
    entries: list[dict[str, Any]] = []
    for line in read_artifact(artifact):
        if len(entries) >= limit:
            break
        line = line.strip()
        if line:
            entry = json.loads(line)
            if isinstance(entry, dict):
                entries.append(entry)
    return (entries if len(entries) >= len(inline) else inline[:limit]), total


def read_lines(store: Any, key: str, max_bytes: int = READ_MAX_BYTES) -> Iterable[str]:
    """The lines of a store file, stopping before ``max_bytes`` have been read."""
    read = 0
    with store.open(key) as fh:
        for raw in fh:
            read += len(raw)
            if read > max_bytes:
                return
            yield raw.decode("utf-8")


# ----------------------------------------------------------------------------------------------- the sides
def compared_job(view: dict[str, Any], result: dict[str, Any]) -> ComparedJob:
    provenance = result.get("provenance") if isinstance(result.get("provenance"), dict) else {}
    digest = next((m.get("digest") for m in [*(provenance.get("models") or []), *(provenance.get("registered")
                                                                                  or [])]
                   if isinstance(m, dict) and m.get("digest")), None)
    model = result.get("model") or result.get("model_name") or view.get("model")
    return ComparedJob(id=view["id"], kind=view.get("kind") or "", label=view.get("label"),
                       model=model if isinstance(model, str) else None, model_digest=digest,
                       estimator=result.get("estimator") if isinstance(result.get("estimator"), str) else None,
                       finished_at=view.get("finished_at"))


# -------------------------------------------------------------------------------------------- attributions
def _words(record: dict[str, Any]) -> tuple[list[str], list[float | None]]:
    words = record.get("display_words") or record.get("words") or []
    values = [_num(v) for v in record.get("word_attributions") or []]
    return [str(w) for w in words][:len(values)], values[:len(words)]


def _sample_words(a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, list[WordDelta]]:
    words_a, va = _words(a)
    words_b, vb = _words(b)
    if [w.lower() for w in words_a] != [w.lower() for w in words_b] or not words_a:
        return False, []
    ra, rb = _rank_desc(va), _rank_desc(vb)
    out = []
    for i, word in enumerate(words_a):
        rank_a = ra[i] if ra[i] is not None else len(words_a)
        rank_b = rb[i] if rb[i] is not None else len(words_b)
        out.append(WordDelta(position=i, word=word, a=va[i], b=vb[i], delta=_sub(vb[i], va[i]), rank_a=rank_a,
                             rank_b=rank_b, rank_change=rank_a - rank_b))
    return True, out


def _vocabulary(records: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """word (lower case) -> (occurrences, sum of attributions) over the records' main view."""
    out: dict[str, list[float]] = {}
    for r in records:
        words = r.get("words") or []
        for word, value in zip(words, r.get("word_attributions") or [], strict=False):
            v = _num(value)
            if v is None:
                continue
            entry = out.setdefault(str(word).lower(), [0, 0.0])
            entry[0] += 1
            entry[1] += v
    return {w: (int(c), s) for w, (c, s) in out.items()}


def compare_attributions(records_a: list[dict[str, Any]], records_b: list[dict[str, Any]],
                         read: dict[str, list[int]]) -> AttributionComparison:
    by_id_b = {str(r.get("id")): r for r in records_b}
    ids_a = [str(r.get("id")) for r in records_a]
    set_a = set(ids_a)
    matched = [(r, by_id_b[i]) for r, i in zip(records_a, ids_a, strict=True) if i in by_id_b]
    only_a = [i for i in ids_a if i not in by_id_b]
    only_b = [str(r.get("id")) for r in records_b if str(r.get("id")) not in set_a]
    scores_a = [_num(a.get("score")) for a, _ in matched]
    scores_b = [_num(b.get("score")) for _, b in matched]
    ranks_a, ranks_b = _rank_desc(scores_a), _rank_desc(scores_b)
    samples = []
    for n, (ra, rb) in enumerate(matched[:SAMPLES_INLINE]):
        same, words = _sample_words(ra, rb)
        largest = max((w for w in words if w.delta is not None), key=lambda w: abs(w.delta or 0.0), default=None)
        samples.append(SampleDelta(
            id=str(ra.get("id")), label=ra.get("label") if isinstance(ra.get("label"), str) else None,
            score_a=scores_a[n], score_b=scores_b[n], score_delta=_sub(scores_b[n], scores_a[n]),
            attribution_sum_a=_num(ra.get("attribution_sum")), attribution_sum_b=_num(rb.get("attribution_sum")),
            rank_a=ranks_a[n], rank_b=ranks_b[n],
            rank_change=None if ranks_a[n] is None or ranks_b[n] is None else ranks_a[n] - ranks_b[n],
            words_match=same, largest_change=largest, words=words))
    both = [(x, y) for x, y in zip(scores_a, scores_b, strict=True) if x is not None and y is not None]
    voc_a = _vocabulary([a for a, _ in matched])
    voc_b = _vocabulary([b for _, b in matched])
    names = list(dict.fromkeys([*voc_a, *voc_b]))
    means_a = [voc_a[w][1] / voc_a[w][0] if w in voc_a else None for w in names]
    means_b = [voc_b[w][1] / voc_b[w][0] if w in voc_b else None for w in names]
    vr_a, vr_b = _rank_desc(means_a), _rank_desc(means_b)
    words = [VocabularyDelta(word=w, count_a=voc_a.get(w, (0, 0.0))[0], count_b=voc_b.get(w, (0, 0.0))[0],
                             mean_a=means_a[i], mean_b=means_b[i], delta=_sub(means_b[i], means_a[i]),
                             rank_a=vr_a[i], rank_b=vr_b[i],
                             rank_change=None if vr_a[i] is None or vr_b[i] is None else vr_a[i] - vr_b[i])
             for i, w in enumerate(names)]
    words.sort(key=lambda v: (v.delta is None, -abs(v.delta or 0.0), v.word))
    return AttributionComparison(
        matched=len(matched), n_only_a=len(only_a), n_only_b=len(only_b), only_a=only_a[:ONLY_INLINE],
        only_b=only_b[:ONLY_INLINE],
        score_spearman=spearman([x for x, _ in both], [y for _, y in both]),
        mean_abs_score_delta=sum(abs(y - x) for x, y in both) / len(both) if both else None,
        samples_inline=len(samples), samples=samples, words_total=len(words), words_inline=min(len(words),
                                                                                            WORDS_INLINE),
        words=words[:WORDS_INLINE], read=read, read_limit=READ_LIMIT)


# -------------------------------------------------------------------------------------------------- tracin
def _key(triple: Any) -> tuple[str, ...]:
    return tuple(str(t) for t in triple) if isinstance(triple, list | tuple) else (str(triple),)


def compare_lists(role: str, list_a: list[dict[str, Any]], list_b: list[dict[str, Any]],
                  value: str = "influence") -> ListComparison:
    """Two ranked lists of training triples (best first; ``value``: the score each entry carries)."""
    list_a, list_b = list_a[:LIST_COMPARED], list_b[:LIST_COMPARED]
    pos_a = {}
    for i, e in enumerate(list_a):
        pos_a.setdefault(_key(e.get("train_triple")), (i + 1, e))
    pos_b = {}
    for i, e in enumerate(list_b):
        pos_b.setdefault(_key(e.get("train_triple")), (i + 1, e))
    k = min(len(list_a), len(list_b))
    top_a = {t for t, (r, _) in pos_a.items() if r <= k}
    top_b = {t for t, (r, _) in pos_b.items() if r <= k}
    union = list(dict.fromkeys([*pos_a, *pos_b]))
    triples = []
    for t in union:
        ra, ea = pos_a.get(t, (None, None))
        rb, eb = pos_b.get(t, (None, None))
        change = ("stayed" if t in top_a and t in top_b else "left" if t in top_a else "entered" if t in top_b
                  else "beyond")
        triples.append(RankedTriple(train_triple=list(t), rank_a=ra, rank_b=rb,
                                    influence_a=_num(ea.get(value)) if ea else None,
                                    influence_b=_num(eb.get(value)) if eb else None, change=change))
    triples.sort(key=lambda x: (x.rank_a is None, x.rank_a or 0, x.rank_b or 0))
    # a triple missing from a list ranks after that list's last entry, all such tied
    xa = [float(x.rank_a if x.rank_a is not None else len(list_a) + 1) for x in triples]
    xb = [float(x.rank_b if x.rank_b is not None else len(list_b) + 1) for x in triples]
    overlap = len(top_a & top_b)
    return ListComparison(role=role, length_a=len(list_a), length_b=len(list_b), k=k, overlap=overlap,
                          overlap_fraction=overlap / k if k else None, union=len(union),
                          spearman=spearman(xa, xb), kendall=kendall_tau_b(xa, xb),
                          entered=len(top_b - top_a), left=len(top_a - top_b), triples=triples)


def compare_influence(result_a: dict[str, Any], result_b: dict[str, Any], entries_a: list[dict[str, Any]],
                      entries_b: list[dict[str, Any]], read: dict[str, list[int]]) -> InfluenceComparison:
    """Mode test: the test triples both explained, matched by triple; mode self: the two rankings."""
    mode = result_a.get("mode")
    common = dict(estimator_a=str(result_a.get("estimator") or "tracin"),
                  estimator_b=str(result_b.get("estimator") or "tracin"), loss_a=str(result_a.get("loss") or ""),
                  loss_b=str(result_b.get("loss") or ""), read=read, read_limit=READ_LIMIT)
    if mode == "self":
        ranking = compare_lists("ranking", entries_a, entries_b, value="self_influence")
        return InfluenceComparison(mode="self", matched=0, n_only_a=0, n_only_b=0, only_a=[], only_b=[],
                                   ranking=ranking, mean_overlap_fraction=ranking.overlap_fraction,
                                   mean_spearman=ranking.spearman, **common)
    by_b = {}
    for e in entries_b:
        by_b.setdefault(_key(e.get("test_triple")), e)
    keys_a = [_key(e.get("test_triple")) for e in entries_a]
    tests = []
    for key, ea in zip(keys_a, entries_a, strict=True):
        eb = by_b.get(key)
        if eb is None:
            continue
        pa, pb = ea.get("prediction") or {}, eb.get("prediction") or {}
        lists = [compare_lists(role, [x for x in ea.get(role) or [] if isinstance(x, dict)],
                               [x for x in eb.get(role) or [] if isinstance(x, dict)])
                 for role in ("proponents", "opponents")]
        tests.append(TestComparison(test_triple=list(key), score_a=_num(pa.get("score")),
                                    score_b=_num(pb.get("score")), rank_a=_num(pa.get("rank")),
                                    rank_b=_num(pb.get("rank")), lists=lists))
    set_a = set(keys_a)
    only_a = [list(k) for k in keys_a if k not in by_b]
    only_b = [list(_key(e.get("test_triple"))) for e in entries_b if _key(e.get("test_triple")) not in set_a]
    fractions = [c.overlap_fraction for t in tests for c in t.lists if c.overlap_fraction is not None]
    rhos = [c.spearman for t in tests for c in t.lists if c.spearman is not None]
    return InfluenceComparison(
        mode="test", matched=len(tests), n_only_a=len(only_a), n_only_b=len(only_b), only_a=only_a[:ONLY_INLINE],
        only_b=only_b[:ONLY_INLINE], tests=tests,
        mean_overlap_fraction=sum(fractions) / len(fractions) if fractions else None,
        mean_spearman=sum(rhos) / len(rhos) if rhos else None, **common)


# ------------------------------------------------------------------------------------------------ training
def flat_row(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A history row with nested values flattened with ``_`` (``{"valid": {"mrr": x}}`` is ``valid_mrr``)."""
    out: dict[str, Any] = {}
    for key, value in (row or {}).items():
        if isinstance(value, dict):
            out.update(flat_row(value, f"{prefix}{key}_"))
        elif not isinstance(value, list):
            out[prefix + key] = value
    return out


def flat_params(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A request as dotted keys (``model.n_layer``); lists kept whole."""
    out: dict[str, Any] = {}
    for key, value in (obj or {}).items():
        if isinstance(value, dict):
            out.update(flat_params(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


UNCOMPARED_FIELDS = ("label", "tags", "name")  # request fields that name a run rather than configure it


def compare_training(result_a: dict[str, Any], result_b: dict[str, Any], request_a: dict[str, Any] | None,
                     request_b: dict[str, Any] | None) -> TrainingComparison:
    rows_a = [flat_row(r) for r in result_a.get("history") or [] if isinstance(r, dict)]
    rows_b = [flat_row(r) for r in result_b.get("history") or [] if isinstance(r, dict)]
    last_a, last_b = (rows_a[-1] if rows_a else {}), (rows_b[-1] if rows_b else {})
    keys = [k for k in dict.fromkeys([*last_a, *last_b]) if _num(last_a.get(k)) is not None
            or _num(last_b.get(k)) is not None]
    metrics = [MetricDelta(key=k, a=_num(last_a.get(k)), b=_num(last_b.get(k)),
                           delta=_sub(_num(last_b.get(k)), _num(last_a.get(k)))) for k in keys]
    fa, fb = flat_params(request_a), flat_params(request_b)
    changed = [FieldDelta(field=f, a=fa.get(f), b=fb.get(f)) for f in dict.fromkeys([*fa, *fb])
               if f not in UNCOMPARED_FIELDS and fa.get(f) != fb.get(f)]
    steps = [[s for s in r.get("steps") or [] if isinstance(s, dict)] for r in (result_a, result_b)]
    return TrainingComparison(history_a=rows_a, history_b=rows_b, steps_a=steps[0], steps_b=steps[1],
                              metrics=metrics, changed_fields=changed)


# ---------------------------------------------------------------------------------------------- the answer
def check_comparable(renderer_a: str | None, kind_a: str, kind_b: str, result_a: dict[str, Any],
                     result_b: dict[str, Any]) -> str:
    """The renderer the comparison follows; ``CompareRefused`` when the jobs cannot be compared."""
    if kind_a != kind_b:
        raise CompareRefused("b", f"job b is a {kind_b} job and job a a {kind_a} job; only jobs of one kind "
                             "can be compared")
    if renderer_a not in COMPARED_RENDERERS:
        raise CompareRefused("a", f"{kind_a} jobs cannot be compared (comparisons exist for attributions, "
                             "TracIn and training kinds)")
    if renderer_a == "influence":
        modes = (result_a.get("mode"), result_b.get("mode"))
        if modes[0] != modes[1]:
            raise CompareRefused("b", f"job a ran mode {modes[0]!r} and job b mode {modes[1]!r}; compare two "
                                 "jobs of one mode")
        if modes[0] not in ("test", "self"):
            raise CompareRefused("a", f"mode {modes[0]!r} results cannot be compared (modes 'test' and 'self' "
                                 "can)")
    return renderer_a


def build(kind: str, renderer: str, view_a: dict[str, Any], view_b: dict[str, Any], result_a: dict[str, Any],
          result_b: dict[str, Any], read_artifact_a: Any, read_artifact_b: Any,
          request_a: dict[str, Any] | None = None, request_b: dict[str, Any] | None = None) -> ComparisonResult:
    """The comparison of two results of ``kind`` (``check_comparable`` first); ``read_artifact_x(name)``
    yields the lines of job x's artifact ``name``."""
    notes: list[str] = []
    section: dict[str, Any] = {}
    if renderer == "attributions":
        records_a, total_a = listed_entries(result_a, "samples", read_artifact_a)
        records_b, total_b = listed_entries(result_b, "samples", read_artifact_b)
        cmp = compare_attributions(records_a, records_b, {"a": [len(records_a), total_a],
                                                          "b": [len(records_b), total_b]})
        if cmp.samples_inline < cmp.matched:
            notes.append(f"the answer lists the first {cmp.samples_inline} of {cmp.matched} matched samples "
                         "(in job a's order); the statistics and words cover every matched sample")
        section["attributions"] = cmp
        for side, (n, total) in cmp.read.items():
            if n < total:
                notes.append(f"job {side}: the first {n} of {total} samples were compared")
    elif renderer == "influence":
        field = "ranking" if result_a.get("mode") == "self" else "results"
        entries_a, total_a = listed_entries(result_a, field, read_artifact_a)
        entries_b, total_b = listed_entries(result_b, field, read_artifact_b)
        cmp = compare_influence(result_a, result_b, entries_a, entries_b,
                                {"a": [len(entries_a), total_a], "b": [len(entries_b), total_b]})
        lengths = [c.length_a for t in cmp.tests for c in t.lists] + [c.length_b for t in cmp.tests for c in t.lists]
        if cmp.ranking is not None:
            lengths += [cmp.ranking.length_a, cmp.ranking.length_b]
        if any(n >= LIST_COMPARED for n in lengths):
            notes.append(f"lists longer than {LIST_COMPARED} entries are compared on their first {LIST_COMPARED}")
        if field == "results":
            for side, (n, total) in cmp.read.items():
                if n < total:
                    notes.append(f"job {side}: the first {n} of {total} test triples were compared")
        if cmp.loss_a != cmp.loss_b:
            notes.append(f"the jobs ran different losses ({cmp.loss_a} and {cmp.loss_b}): their influences are "
                         "on different scales; compare ranks, not values")
        section["influence"] = cmp
    else:
        section["training"] = compare_training(result_a, result_b, request_a, request_b)
    return ComparisonResult(kind=kind, renderer=renderer, a=compared_job(view_a, result_a),
                            b=compared_job(view_b, result_b), notes=notes, **section)
