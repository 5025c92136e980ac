"""Attribution reports a researcher can read without a mouse: the words as the text has them (original casing,
character spans), the history the user vector was built from, a completeness warning for a sample whose
attributions do not add up, the words' CSV, and a comparison that marks per sample the words that changed most.

Models here are small untrained NRMS (word embeddings, or MiniLM's WordPiece for a tokenizer that lower-cases by
itself): the report's bookkeeping does not depend on what a model learned.
"""

from __future__ import annotations

import csv
import io
import math

import pytest
import torch

from models.news.attribution import IGOptions, compare_reports, explain
from models.news.data import Sample
from models.news.modules import build_model
from models.news.summary import (
    WORDS_CSV_COLUMNS,
    CompletenessWarnings,
    ReportAccumulator,
    WordsCsv,
    compare,
    compare_sample,
    completeness_excess,
)
from models.news.text import WordTokenizer

HEADLINE = "SHOCKING: Fans can't believe the Derby result"
HISTORY = ["Senate passes the Budget bill", "Lakers beat Celtics in overtime", "Markets rally on Rate cut",
           "Coach praises the Defence"]


def _word_model(seed: int = 0):
    torch.manual_seed(seed)
    tok = WordTokenizer.build([HEADLINE, *HISTORY])
    return build_model({"kind": "nrms", "encoder": "word", "emb_dim": 16, "heads": 2, "head_dim": 4,
                        "query_dim": 8, "dropout": 0.0}, tokenizer=tok).eval()


def _sample(sid: str = "s1", candidate: str = HEADLINE, history: list[str] | None = None) -> Sample:
    return Sample(id=sid, history=list(history or HISTORY), candidate=candidate, label="fake")


def test_word_spans_map_lower_cased_matches_back_to_the_text_as_given() -> None:
    text = "SHOCKING: İstanbul's ÆON 2x"
    spans = WordTokenizer.word_spans(text)
    # Every span, lower-cased, holds the word the tokenizer reads there; "İ" lower-cases to "i" and a combining
    # dot, two words of one character of the text, and the positions after it are not shifted.
    words = WordTokenizer.words(text)
    assert len(spans) == len(words)
    for (a, b), w in zip(spans, words, strict=True):
        assert w in text[a:b].lower()
    assert [text[a:b] for a, b in spans][-3:] == ["Æ", "ON", "2x"] or [text[a:b] for a, b in spans][-2:] == \
        ["ÆON", "2x"]
    assert text[spans[0][0]:spans[0][1]] == "SHOCKING"


@pytest.mark.parametrize("text", ["SHOCKING: Fans can't believe it", "İstanbul İİ ÆON ǅemal ﬁnal 2x",
                                  "ΣΊΣΥΦΟΣ's ΌΡΟΣ", "", "  ...  ", "Straße STRASSE ẞ"])
def test_word_spans_fast_path_equals_the_character_map(text: str) -> None:
    assert WordTokenizer.word_spans(text) == WordTokenizer.word_spans_reference(text)
    assert len(WordTokenizer.word_spans(text)) == len(WordTokenizer.words(text))


def test_report_keeps_the_original_casing_spans_and_the_history() -> None:
    model = _word_model()
    report = explain(model, [_sample(history=[f"old title {i}" for i in range(5)] + HISTORY)],
                     IGOptions(n_steps=8, precision="fp32", max_history=4))
    rec = report["samples"][0]
    assert rec["words"] == WordTokenizer.words(HEADLINE)  # what the model reads: lower-cased
    assert rec["display_words"][:2] == ["SHOCKING", ":"]
    assert all(HEADLINE[a:b] == d for (a, b), d in zip(rec["spans"], rec["display_words"], strict=True))
    assert [d.lower() for d in rec["display_words"]] == rec["words"]
    assert rec["history"] == HISTORY  # the last max_history titles: what the user vector was built from


def test_minilm_display_words_come_from_the_fast_tokenizers_offsets() -> None:
    """MiniLM's WordPiece lower-cases and splits words into pieces: the report's words are its pieces joined,
    the display words the text's own characters over the pieces' offsets."""
    from models.news.attribution import word_spans
    from models.news.text import BertNewsTokenizer, minilm_dir

    tok = BertNewsTokenizer(minilm_dir())
    text = "SHOCKING: Unbelievable Lakers comeback"
    enc = tok.encode([text], 32)
    ids = enc.ids[0].tolist()
    words = tok.group_words(tok.convert_ids_to_tokens(ids), ids, enc.word_ids[0])
    assert [w for w, _ in words][:2] == ["shocking", ":"]
    assert [text[a:b] for a, b in word_spans(words, enc.offsets[0])] == ["SHOCKING", ":", "Unbelievable",
                                                                        "Lakers", "comeback"]


def test_completeness_warning_names_a_sample_whose_attributions_do_not_add_up() -> None:
    good = {"id": "ok", "relative_delta": 1e-4}
    bad = {"id": "crafted", "relative_delta": 0.42}
    body = {"id": "naml", "relative_delta": 0.0, "views": {"body": {"relative_delta": float("nan")}}}
    assert completeness_excess(good, 0.05) == []
    assert completeness_excess(bad, 0.05) == [("title", 0.42)]
    assert completeness_excess(bad, 0.5) == []  # the threshold is the request's
    assert completeness_excess(body, 0.05)[0][0] == "body"  # a non-finite error is never hidden
    lines = CompletenessWarnings(0.05).extend([good, bad]).warnings()
    assert len(lines) == 1 and "'crafted'" in lines[0] and "0.42" in lines[0] and "0.05" in lines[0]
    many = CompletenessWarnings(0.05).extend({"id": f"s{i}", "relative_delta": 1.0} for i in range(25)).warnings()
    assert len(many) == 11 and many[-1].startswith("15 more samples")


def test_a_real_run_at_one_step_warns_in_its_report() -> None:
    """One left-Riemann step evaluates the gradient at the baseline only: completeness fails, and the worker's
    warnings say which sample."""
    from workers.jobs.attributions import DEFAULT_WARN_RELATIVE_DELTA

    model = _word_model(1)
    report = explain(model, [_sample("a"), _sample("b", "Lakers beat Celtics")],
                     IGOptions(n_steps=1, method="riemann_left", precision="fp32"))
    over = [r for r in report["samples"] if completeness_excess(r, DEFAULT_WARN_RELATIVE_DELTA)]
    assert over, [r["relative_delta"] for r in report["samples"]]
    lines = CompletenessWarnings(DEFAULT_WARN_RELATIVE_DELTA).extend(report["samples"]).warnings()
    assert {r["id"] for r in over} == {sid for sid in ("a", "b") if any(f"'{sid}'" in w for w in lines)}


def test_words_csv_holds_every_word_with_its_exact_attribution() -> None:
    model = _word_model()
    report = explain(model, [_sample("a"), _sample("b", "Lakers beat Celtics")], IGOptions(n_steps=8,
                                                                                          precision="fp32"))
    fh = io.StringIO()
    out = WordsCsv(fh)
    for rec in report["samples"]:
        out.add("m", rec)
    rows = list(csv.DictReader(io.StringIO(fh.getvalue())))
    assert list(rows[0]) == WORDS_CSV_COLUMNS
    expected = [(r["id"], i, w, d, a) for r in report["samples"]
                for i, (w, d, a) in enumerate(zip(r["words"], r["display_words"], r["word_attributions"],
                                                  strict=True))]
    assert [(r["sample_id"], int(r["position"]), r["word"], r["display_word"], float(r["attribution"]))
            for r in rows] == expected  # float(repr(x)) == x: the exact numbers


def test_per_sample_comparison_marks_the_top_n_changes_by_span() -> None:
    base = {"id": "s", "words": ["shocking", ":", "fans"], "display_words": ["SHOCKING", ":", "Fans"],
            "spans": [[0, 8], [8, 9], [10, 14]], "word_attributions": [1.0, 0.5, -2.0]}
    # another tokenizer: ":" is not a word of its own, and the words are listed in another order
    other = {"id": "s", "words": ["fans", "shocking"], "spans": [[10, 14], [0, 8]],
             "word_attributions": [-1.0, 3.0]}
    out = compare_sample(base, other, 1)
    assert out["aligned"] == 2
    assert out["changed"] == [{"word": "SHOCKING", "index_a": 0, "index_b": 1, "before": 1.0, "after": 3.0,
                               "change": 2.0}]
    assert [r["word"] for r in compare_sample(base, other, 5)["changed"]] == ["SHOCKING", "Fans"]
    assert compare_sample(base, base, 3)["changed"] == []  # nothing changed, nothing marked


def test_comparison_table_keeps_words_seen_at_least_k_times() -> None:
    def rec(sid: str, words: list[str], attrs: list[float]) -> dict:
        return {"id": sid, "words": words, "word_attributions": attrs, "relative_delta": 0.0}

    a = [rec(f"s{i}", ["common", f"rare{i}"], [0.0, 0.0]) for i in range(3)]
    b = [rec(f"s{i}", ["common", f"rare{i}"], [1.0, 5.0]) for i in range(3)]
    acc_a, acc_b = ReportAccumulator().extend(a), ReportAccumulator().extend(b)
    assert {r["word"] for r in compare(acc_a, acc_b, 0.1)["changed"]} == {"common", "rare0", "rare1", "rare2"}
    kept = compare(acc_a, acc_b, 0.1, changed_min_count=3)["changed"]
    assert [(r["word"], r["count"]) for r in kept] == [("common", 3)]


def test_compare_reports_per_sample_follows_the_request_top_n() -> None:
    model_a, model_b = _word_model(0), _word_model(1)
    ss = [_sample("a"), _sample("b", "Lakers beat Celtics in overtime")]
    ra = explain(model_a, ss, IGOptions(n_steps=8, precision="fp32"))
    rb = explain(model_b, ss, IGOptions(n_steps=8, precision="fp32"))
    out = compare_reports(ra, rb, top_n=2)
    assert [p["id"] for p in out["per_sample"]] == [r["id"] for r in ra["samples"]]
    for p, r in zip(out["per_sample"], ra["samples"], strict=True):
        assert len(p["changed"]) == 2
        changes = sorted((abs(b - a) for a, b in zip(r["word_attributions"], next(
            x for x in rb["samples"] if x["id"] == r["id"])["word_attributions"], strict=True)), reverse=True)
        assert [abs(c["change"]) for c in p["changed"]] == pytest.approx(changes[:2])
        assert all(math.isfinite(c["change"]) for c in p["changed"])


def test_a_comparison_reports_progress_in_samples_not_in_passes() -> None:
    """12 samples under two models end at 12 / 12 samples (not 24), half way at 6, each message naming its pass."""
    from workers.jobs.attributions import _pass_progress

    calls = []

    class Ctx:
        def progress(self, done, total, unit, message=None):
            calls.append((done, total, unit, message))

    progress_for = _pass_progress(Ctx(), 2, 12)
    progress_for(0)(12, 12, "title: 12/12 samples")
    progress_for(1)(6, 12, "title: 6/12 samples")
    progress_for(1)(12, 12, "title: 12/12 samples")
    assert [c[:3] for c in calls] == [(6, 12, "samples"), (9, 12, "samples"), (12, 12, "samples")]
    assert calls[1][3].startswith("model 2 of 2: ")
    one = _pass_progress(Ctx(), 1, 3)
    one(0)(3, 3, "title: 3/3 samples")
    assert calls[-1] == (3, 3, "samples", "title: 3/3 samples")
