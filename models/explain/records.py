"""One attributed text as a report shows it, for any model family: its tokens and their attributions, the words the
tokens group into (the text's own spelling and character spans beside the model's), each word's attribution, the
completeness terms and the strongest words of each sign (``core.contract.results.attributions.ViewRecord``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def view_record(text: str, tokens: Sequence[str], token_attributions: Sequence[float],
                words: Sequence[tuple[str, Sequence[int]]], spans: Sequence[tuple[int, int] | None],
                score: float, baseline_score: float, attribution_sum: float, relative_delta: float,
                top_k: int) -> dict[str, Any]:
    """The record of one attributed text: ``words`` are ``(word, token positions)``, ``spans`` each word's
    ``[start, end)`` characters in ``text`` (None: unknown); a word's attribution is its tokens' sum."""
    word_attr = [float(sum(token_attributions[i] for i in pos)) for _, pos in words]
    ranked = sorted(zip([w for w, _ in words], word_attr, strict=True), key=lambda t: -t[1])
    return {
        "tokens": list(tokens),
        "token_attributions": [float(a) for a in token_attributions],
        "words": [w for w, _ in words],
        # each word as the text has it (original casing), and its [start, end) characters there (None: unknown)
        "display_words": [(text[sp[0]:sp[1]] if sp is not None else "") or w
                          for (w, _), sp in zip(words, spans, strict=True)],
        "spans": [list(sp) if sp is not None else None for sp in spans],
        "word_attributions": word_attr,
        "score": score,
        "baseline_score": baseline_score,
        "attribution_sum": attribution_sum,
        "delta": attribution_sum - (score - baseline_score),
        "relative_delta": relative_delta,
        "top_positive": [{"word": w, "attribution": a} for w, a in ranked if a > 0][:top_k],
        "top_negative": [{"word": w, "attribution": a} for w, a in reversed(ranked) if a < 0][:top_k],
    }
