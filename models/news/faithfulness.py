"""Faithfulness of a news recommender's word attributions (:mod:`models.explain.faithfulness`).

The words, the masking and the score are the attribution's own: the candidate's first view (the title; NAML's
body is held at its real value, as when the title is attributed), its words as the report groups them, masked to
the same baseline IG integrated from (``pad`` or ``zero``), scored by the same function
:math:`\\langle \\mathrm{news\\_encoder}(e), u \\rangle` with the cached user vector. Three word rankings per
sample: the run's IG attributions, a seeded random order, and occlusion (:func:`models.explain.occlusion.occlusion`
token drops summed per word, as ``method: occlusion`` reports them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from models.explain.faithfulness import FRACTIONS, MAX_CURVE_POINTS, evaluate, sample_words, summarize
from models.explain.occlusion import occlusion
from models.news.chunks import build_chunk, length_chunks
from models.news.modules import NewsRecommender

CHUNK_SAMPLES = 32  # samples whose variants are built and scored together


def word_positions(model: NewsRecommender, p: Any, view: str) -> list[list[int]]:
    """Token positions of each word of ``view``, grouped exactly as the report's ``words``."""
    ids = p.enc[view][0].tolist()
    tokens = model.tokenizer.convert_ids_to_tokens(ids)
    return [pos for _, pos in model.tokenizer.group_words(tokens, ids, (p.word_ids or {}).get(view))]


def faithfulness_section(model: NewsRecommender, prepared: Sequence[Any], records: Sequence[dict[str, Any]],
                         baseline: str, seed: int, attribution_seconds: float, reference: bool = False,
                         progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Add ``faithfulness`` to every record (a sample's report with ``id``, ``words`` and ``word_attributions``)
    and return the run's summary of it (:func:`models.explain.faithfulness.summarize`, with its settings and
    its time against the attribution's). ``reference``: score every variant alone (the slow reference path)."""
    t0, c0 = time.perf_counter(), time.process_time()
    view = model.views[0]
    by_id = {r["id"]: r for r in records}
    items = [p for p in prepared if p.sample.id in by_id]
    lengths = [int(p.enc[view][0].shape[0]) for p in items]
    done = 0
    all_recs: list[dict[str, Any]] = []
    for chunk in length_chunks(lengths, CHUNK_SAMPLES, exact=model.device.type != "cuda"):
        part = [items[i] for i in chunk]
        ch = build_chunk(model, part, view, baseline)
        occ = occlusion(ch.forward, ch.x, ch.base, ch.content).attributions[..., 0].double().cpu().numpy()
        samples = [sample_words(f"sample {p.sample.id!r}", p.sample.id, word_positions(model, p, view),
                                by_id[p.sample.id]["word_attributions"], occ[j], seed) for j, p in enumerate(part)]
        results = evaluate(ch.forward, ch.x, ch.base, samples, FRACTIONS, reference=reference)
        for p, res in zip(part, results, strict=True):
            by_id[p.sample.id]["faithfulness"] = res
            all_recs.append(res)
        done += len(part)
        if progress is not None:
            progress(done, len(items))
    return merged_section(all_recs, view, seed, baseline, time.perf_counter() - t0, time.process_time() - c0,
                          attribution_seconds)


def merged_section(records: Sequence[dict[str, Any]], view: str | None, seed: int, baseline: str, seconds: float,
                   cpu_seconds: float, attribution_seconds: float) -> dict[str, Any]:
    """The run's faithfulness summary from the per-sample ``faithfulness`` of its records, in sample order (a whole
    run's, or a sharded run's merged records): the keys of :func:`faithfulness_section`, times summed over the
    parts (as the attribution's are)."""
    return {**summarize(records, FRACTIONS), "view": view, "seed": seed, "baseline": baseline,
            "max_curve_points": MAX_CURVE_POINTS, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "attribution_seconds": attribution_seconds,
            "time_ratio": seconds / attribution_seconds if attribution_seconds > 0 else None}
