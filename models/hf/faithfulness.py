"""Faithfulness of a Hugging Face classifier's word attributions (:mod:`models.explain.faithfulness`).

The words, the masking and the score are the attribution's own: each text's words as its record groups them,
masked to the same baseline IG integrated from (``pad``, ``mask`` or ``zero``), scored by the same function (the
logit of the class the record explains, ``target``), over batches of texts of one token length (no padding). Three
word rankings per text: the run's IG attributions, a seeded random order, and occlusion
(:func:`models.explain.occlusion.occlusion` token drops summed per word).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from models.explain.faithfulness import FRACTIONS, evaluate, sample_words
from models.explain.occlusion import occlusion
from models.hf.batches import VIEW, Prepared, build_batch, length_batches, logits_from_embeddings
from models.hf.checkpoint import HFClassifier
from models.news.faithfulness import merged_section

CHUNK_SAMPLES = 32  # texts whose variants are built and scored together


def faithfulness_section(clf: HFClassifier, prepared: Sequence[Prepared], records: Sequence[dict[str, Any]],
                         baseline: str, seed: int, attribution_seconds: float, reference: bool = False,
                         progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Add ``faithfulness`` to every record (``id``, ``words``, ``word_attributions``, ``target``) and return the
    run's summary of it (the keys of :func:`models.news.faithfulness.merged_section`). ``reference``: score every
    variant alone."""
    t0, c0 = time.perf_counter(), time.process_time()
    by_id = {r["id"]: r for r in records}
    items = [p for p in prepared if p.sample.id in by_id]
    logits = logits_from_embeddings(clf)
    done = 0
    for part in length_batches(items, CHUNK_SAMPLES):
        recs = [by_id[p.sample.id] for p in part]
        batch = build_batch(clf, part, baseline, logits, [int(r["target"]["index"]) for r in recs])
        occ = occlusion(batch.forward, batch.x, batch.base, batch.content).attributions[..., 0].double().cpu()
        samples = [sample_words(f"text {p.sample.id!r}", p.sample.id, [pos for _, pos in p.words],
                                rec["word_attributions"], occ[j], seed)
                   for j, (p, rec) in enumerate(zip(part, recs, strict=True))]
        results = evaluate(batch.forward, batch.x, batch.base, samples, FRACTIONS, reference=reference)
        for rec, res in zip(recs, results, strict=True):
            rec["faithfulness"] = res
        done += len(part)
        if progress is not None:
            progress(done, len(items))
    # every record in the request's order (a sharded run's reduce step merges them in that order too)
    every = [by_id[p.sample.id]["faithfulness"] for p in sorted(items, key=lambda p: p.index)]
    return merged_section(every, VIEW, seed, baseline, time.perf_counter() - t0, time.process_time() - c0,
                          attribution_seconds)
