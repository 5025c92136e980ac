"""MIND read and scored as MIND: empty histories, per-impression AUC, negatives without replacement, BOMs, malformed
rows, missing news ids and unknown click labels, against small hand-written files."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from models.news.data import read_mind, read_split
from models.news.modules import build_model
from models.news.text import WordTokenizer
from models.news.train import TrainConfig, evaluate, sample_negatives, train, training_examples

NEWS = [
    ("N1", "sports", "Lakers beat Celtics in overtime thriller"),
    ("N2", "sports", "Yankees clinch playoff spot with late goal"),
    ("N3", "politics", "Senate passes budget bill after long debate"),
    ("N4", "politics", "Governor unveils plan to cut taxes"),
    ("N5", "technology", "Apple unveils new smartphone with faster chip"),
    ("N6", "technology", "Google launches artificial intelligence assistant"),
    ("N7", "health", "Doctors warn about rising flu cases this winter"),
    ("N8", "health", "New study links exercise to lower heart disease risk"),
]
# impression 2 and 4 have an empty history (new users), as MIND's behaviors.tsv has
BEHAVIORS = [
    ("1", "U1", "N1 N2", "N3-0 N4-0 N5-1 N6-0"),
    ("2", "U2", "", "N1-1 N7-0 N8-0"),
    ("3", "U3", "N3 N5 N7", "N2-0 N4-1 N6-1 N8-0 N1-0"),
    ("4", "U4", "", "N5-0 N6-1"),
    ("5", "U1", "N1", "N2-1 N3-0 N4-0 N7-0"),
]


def write_split(path: Path, news=NEWS, behaviors=BEHAVIORS, bom: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    prefix = "\ufeff" if bom else ""
    (path / "news.tsv").write_text(prefix + "".join(f"{n}\t{c}\t{c}\t{t}\t\t\t[]\t[]\n" for n, c, t in news),
                                   encoding="utf-8")
    (path / "behaviors.tsv").write_text(
        prefix + "".join(f"{i}\t{u}\t11/11/2019 9:00:00 AM\t{h}\t{c}\n" for i, u, h, c in behaviors),
        encoding="utf-8")
    return path


def _model():
    torch.manual_seed(0)
    tok = WordTokenizer.build([t for _, _, t in NEWS])
    cfg = {"kind": "nrms", "encoder": "word", "emb_dim": 8, "heads": 2, "head_dim": 4, "query_dim": 8,
           "dropout": 0.0, "max_title_len": 12}
    return build_model(cfg, tok).eval()


def test_empty_history_has_a_zero_user_vector_not_nan() -> None:
    model = _model()
    user = model.user_vector(torch.randn(2, 3, 8), torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.isfinite(user).all()
    assert torch.equal(user[1], torch.zeros_like(user[1])) and user[0].abs().sum() > 0


def test_empty_history_impressions_are_scored_and_trained_on(tmp_path: Path) -> None:
    split = read_mind(write_split(tmp_path / "s"))
    model = _model()
    metrics = evaluate(model, split)
    assert metrics["impressions"] == 5  # all five, the two with an empty history included
    from models.news.train import NewsTable

    examples = training_examples(split, NewsTable(model, split), 50)
    assert len(examples) == 6 and sum(1 for h, _, _ in examples if not h) == 2
    result = train(model, split, None, TrainConfig(epochs=1, batch_size=4, negatives=2))
    assert result["train_examples"] == 6 and np.isfinite(result["epochs"][0]["loss"])


def test_auc_is_the_mean_of_per_impression_aucs(tmp_path: Path) -> None:
    split = read_mind(write_split(tmp_path / "s"))
    model = _model()
    titles = {n: t for n, _, t in NEWS}
    per_imp, labels_all, scores_all = [], [], []
    with torch.no_grad():
        for _, _, hist, cands in BEHAVIORS:
            ids = [c.rsplit("-", 1)[0] for c in cands.split()]
            labels = [int(c.rsplit("-", 1)[1]) for c in cands.split()]
            if hist:
                scores = model.score_texts([titles[h] for h in hist.split()], [titles[i] for i in ids]).numpy()
            else:
                scores = np.zeros(len(ids))
            per_imp.append(roc_auc_score(labels, scores))
            labels_all += labels
            scores_all += scores.tolist()
    metrics = evaluate(model, split)
    assert metrics["auc"] == pytest.approx(float(np.mean(per_imp)), abs=1e-5)
    assert metrics["pooled_auc"] == pytest.approx(roc_auc_score(labels_all, scores_all), abs=1e-5)
    assert "imp_auc" not in metrics


def test_negatives_are_drawn_without_replacement_when_enough_exist() -> None:
    rng = random.Random(0)
    for _ in range(200):
        drawn = sample_negatives(rng, list(range(6)), 4)
        assert len(drawn) == 4 and len(set(drawn)) == 4
    short = sample_negatives(rng, [7, 8], 4)
    assert len(short) == 4 and set(short) <= {7, 8}


def test_bom_is_accepted(tmp_path: Path) -> None:
    split = read_mind(write_split(tmp_path / "s", bom=True))
    assert "N1" in split.news and split.behaviors[0].id == "1"


def test_malformed_row_names_file_and_line(tmp_path: Path) -> None:
    root = tmp_path / "d"
    split_dir = write_split(root / "train")
    with open(split_dir / "behaviors.tsv", "a", encoding="utf-8") as fh:
        fh.write("6\tU6\tN1 N2\n")
    with pytest.raises(ValueError, match=r"behaviors\.tsv:6: expected 5 tab-separated columns"):
        read_split(root, "train")


def test_missing_history_id_is_a_clear_error(tmp_path: Path) -> None:
    behaviors = [*BEHAVIORS, ("6", "U6", "N1 N99", "N2-1 N3-0")]
    with pytest.raises(ValueError, match=r"behaviors\.tsv:6: impression 6 names news \['N99'\] missing from"):
        read_mind(write_split(tmp_path / "s", behaviors=behaviors))


def test_unknown_click_labels_are_warned_not_silently_unlabelled(tmp_path: Path) -> None:
    behaviors = [*BEHAVIORS, ("6", "U6", "N1", "N2-2 N3-0 N4-1")]
    split = read_mind(write_split(tmp_path / "s", behaviors=behaviors))
    assert split.behaviors[-1].candidates == [("N2", None), ("N3", 0), ("N4", 1)]
    assert len(split.warnings) == 1 and "1 impression token" in split.warnings[0] and "'N2-2'" in split.warnings[0]
    assert read_mind(write_split(tmp_path / "clean")).warnings == []
