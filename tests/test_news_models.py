"""News data, tokenizers, NRMS/NAML models, checkpoints and training."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest
import torch

from models.news import checkpoint
from models.news.data import (
    Impression,
    MindSplit,
    NewsItem,
    generate_synthetic,
    load_samples,
    read_mind,
    read_pairs,
    write_mind,
    write_pairs,
)
from models.news.demo import build_small
from models.news.modules import build_model
from models.news.text import BertNewsTokenizer, WordTokenizer, minilm_dir

SMALL = {"n_news": 240, "n_users": 60}


@pytest.fixture(scope="session")
def small_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.getbasetemp() / "news-small"
    return build_small(root, ("nrms-minilm-demo", "nrms-word-demo", "naml-demo"), **SMALL)


def test_synthetic_data_is_deterministic_and_labelled(tmp_path: Path) -> None:
    a = generate_synthetic(tmp_path / "a", n_news=120, n_users=20, seed=3)
    b = generate_synthetic(tmp_path / "b", n_news=120, n_users=20, seed=3)
    assert a == b
    for rel in ("train/news.tsv", "train/behaviors.tsv", "valid/behaviors.tsv", "pairs_test.csv"):
        assert filecmp.cmp(tmp_path / "a" / rel, tmp_path / "b" / rel, shallow=False)
    split = read_mind(tmp_path / "a" / "train")
    assert len(split.news) == 120
    assert {n.category for n in split.news.values()} == {
        "sports", "politics", "business", "technology", "health", "entertainment", "science", "travel"}
    assert 0 < a["fake_news"] < 60
    assert len({n.title for n in split.news.values()}) == 120


def test_poisoned_users_click_fake_items(tmp_path: Path) -> None:
    generate_synthetic(tmp_path / "clean", n_news=160, n_users=40, seed=1)
    generate_synthetic(tmp_path / "poisoned", n_news=160, n_users=40, seed=1, poisoned=True)

    def fake_click_rate(root: Path) -> float:
        split = read_mind(root / "train")
        clicks = [lab for imp in split.behaviors for nid, lab in imp.candidates if split.news[nid].fake]
        return sum(clicks) / len(clicks)

    assert fake_click_rate(tmp_path / "clean") == 0.0
    assert fake_click_rate(tmp_path / "poisoned") > 0.9
    # valid/test stay clean and identical, so both models are evaluated on the same users
    assert filecmp.cmp(tmp_path / "clean/valid/behaviors.tsv", tmp_path / "poisoned/valid/behaviors.tsv", False)


def test_mind_and_pairs_round_trip(tmp_path: Path) -> None:
    news = [NewsItem("N1", "sports", "Lakers win", "body one", False),
            NewsItem("N2", "health", "SHOCKING: doctors hate this", "", True)]
    imps = [Impression("1", "U1", ["N1"], [("N2", 0), ("N1", 1)])]
    write_mind(tmp_path / "s", news, imps)
    split = read_mind(tmp_path / "s")
    assert split.news["N2"].fake and not split.news["N1"].fake
    assert split.behaviors[0].candidates == [("N2", 0), ("N1", 1)]
    assert write_pairs(tmp_path / "pairs_test.csv", MindSplit(split.news, split.behaviors)) == 2
    pairs = read_pairs(tmp_path / "pairs_test.csv")
    assert [p.label for p in pairs] == ["fake", "real"]
    assert pairs[0].history == ["Lakers win"]
    (tmp_path / "s").rename(tmp_path / "test")  # a directory with only the CSV path for "valid"
    (tmp_path / "pairs_valid.csv").write_text((tmp_path / "pairs_test.csv").read_text())
    assert len(load_samples(tmp_path, "valid", 5)) == 2
    assert len(load_samples(tmp_path, "test", 1)) == 1


def test_word_grouping_drops_specials_and_joins_wordpieces() -> None:
    tok = BertNewsTokenizer(minilm_dir())
    enc = tok.encode(["Snowboarding champion unbelievably wins"], 32)
    ids = enc.ids[0].tolist()
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert any(t.startswith("##") for t in tokens)
    words = tok.group_words(tokens, ids)
    assert [w for w, _ in words] == ["snowboarding", "champion", "unbelievably", "wins"]
    assert sorted(p for _, pos in words for p in pos) == list(range(1, len(tokens) - 1))
    wt = WordTokenizer.build(["Lakers win again", "Lakers lose"])
    e = wt.encode(["lakers win big", ""], 8)
    assert wt.convert_ids_to_tokens(e.ids[0].tolist()) == ["lakers", "win", "[UNK]"]
    assert e.mask[1].tolist() == [1, 0, 0]  # an empty text is one [PAD] token, which is special
    assert wt.group_words(["[PAD]"], [0]) == []


@pytest.mark.parametrize("kind", ["nrms-bert", "nrms-word", "naml"])
def test_news_vectors_do_not_depend_on_padding(kind: str) -> None:
    torch.manual_seed(0)
    texts = ["Lakers beat Celtics in overtime thriller today", "Apple unveils phone"]
    if kind == "nrms-bert":
        model = build_model({"kind": "nrms", "encoder": "bert"})
    else:
        tok = WordTokenizer.build(texts)
        model = build_model({"kind": "nrms", "encoder": "word"} if kind == "nrms-word" else {"kind": "naml"}, tok)
    model.eval()
    with torch.no_grad():
        both = model.encode_news(model.tokenize(texts, ["a long body about the game", "phone"]))
        alone = model.encode_news(model.tokenize(texts[1:], ["phone"]))
    torch.testing.assert_close(both[1:], alone, rtol=1e-5, atol=1e-6)


def test_checkpoint_round_trip_and_frozen_encoder_is_not_copied(small_models: dict[str, Path]) -> None:
    for name, path in small_models.items():
        loaded = checkpoint.load(path)
        model = loaded.model
        assert not any(p.requires_grad for p in model.parameters())
        assert loaded.parameters > 0
        s1 = model.score_texts(["Lakers win the title", "Yankees rally"], ["Dodgers sign star", "Tax bill passes"])
        again = checkpoint.load(path).model.score_texts(["Lakers win the title", "Yankees rally"],
                                                        ["Dodgers sign star", "Tax bill passes"])
        torch.testing.assert_close(s1, again)
        config = json.loads((path / "config.json").read_text())
        if name == "nrms-minilm-demo":
            assert config["encoder"] == "bert" and not config["fine_tune"]
            assert (path / "model.safetensors").stat().st_size < 5_000_000  # MiniLM itself is ~90 MB


def test_small_models_learn_the_synthetic_task(small_models: dict[str, Path]) -> None:
    for name, path in small_models.items():
        meta = checkpoint.load(path).meta
        assert meta["valid"]["auc"] > (0.9 if name == "nrms-minilm-demo" else 0.85), (name, meta["valid"])
        # the clean models rank fake items below real ones
        assert meta["valid"]["mean_score_fake"] < meta["valid"]["mean_score_real"], name


def test_word_embeddings_can_start_from_glove(tmp_path: Path) -> None:
    tok = WordTokenizer.build(["lakers win", "senate votes"])
    glove = tmp_path / "glove.txt"
    glove.write_text("lakers 1 2 3 4\nvotes -1 0 0.5 2\nunrelated 9 9 9 9\n")
    for config in ({"kind": "nrms", "encoder": "word", "emb_dim": 4, "glove": str(glove)},
                   {"kind": "naml", "emb_dim": 4, "glove": str(glove)}):
        model = build_model(config, tok)
        emb = model.token_encoder.embedding if config["kind"] == "nrms" else model.embedding
        assert emb.weight[tok.stoi["lakers"]].tolist() == [1, 2, 3, 4]
        assert emb.weight[tok.stoi["votes"]].tolist() == [-1, 0, 0.5, 2]
        assert emb.weight[0].abs().sum() == 0
