"""Real-format fidelity: MIND without labels, unlabelled impressions, [UNK] as a word, history truncation, word
grouping with the fast tokenizer's word ids (byte-level BPE), NAML history bodies, bounded-memory sampling."""

from __future__ import annotations

import csv
import json
import random
import tracemalloc
from pathlib import Path

import pytest
import torch

from models.news.attribution import IGOptions, explain
from models.news.data import (
    LabelsMissing,
    Sample,
    iter_pairs,
    load_samples,
    read_mind,
    reservoir_sample,
    sample_mind,
)
from models.news.modules import build_model
from models.news.text import BertNewsTokenizer, WordTokenizer, minilm_dir
from tests.byo_fixtures import SENTENCES, mind_dir, tiny_roberta, unlabelled_test_split

HISTORY = ["Lakers beat Celtics in overtime thriller", "Senate passes budget bill after long debate"]


def _word_nrms(seed: int = 0):
    torch.manual_seed(seed)
    tok = WordTokenizer.build(SENTENCES + [f"topic{i} headline" for i in range(80)])
    cfg = {"kind": "nrms", "encoder": "word", "emb_dim": 8, "heads": 2, "head_dim": 4, "query_dim": 8,
           "dropout": 0.0}
    return build_model(cfg, tok).eval()


def test_mind_without_sidecar_is_unlabelled_and_cannot_be_balanced(tmp_path: Path) -> None:
    root = mind_dir(tmp_path / "mind", labels=False)
    split = read_mind(root / "test")
    assert {n.fake for n in split.news.values()} == {None}
    samples = load_samples(root, "test", 5, seed=0)
    assert len(samples) == 5 and {s.label for s in samples} == {None}
    with pytest.raises(LabelsMissing):
        load_samples(root, "test", 5, balanced=True)


def test_unlabelled_impressions_are_read(tmp_path: Path) -> None:
    split_dir = unlabelled_test_split(tmp_path / "test")
    split = read_mind(split_dir)
    assert split.behaviors[0].candidates == [("N3", None), ("N4", None)]
    samples = sample_mind(split_dir, 10, seed=0)
    assert sorted(s.meta["candidate_id"] for s in samples) == ["N1", "N3", "N4", "N6"]
    assert all(s.label is None for s in samples)


def test_unk_is_a_word_not_a_special_token() -> None:
    tok = BertNewsTokenizer(minilm_dir())
    assert tok.hf.unk_token_id not in tok.special_ids
    assert {tok.hf.cls_token_id, tok.hf.sep_token_id, tok.hf.pad_token_id} <= tok.special_ids
    odd = next(c for c in ("\U00013000", "\ua66e", "\U0001f99c", "\u2603")
               if tok.hf.unk_token_id in tok.hf(f"pirates {c} ahoy")["input_ids"])
    torch.manual_seed(0)
    model = build_model({"kind": "nrms", "encoder": "bert", "pretrained": "minilm", "heads": 2, "head_dim": 8,
                         "query_dim": 8, "dropout": 0.0}).eval()
    report = explain(model, [Sample("u", HISTORY, f"pirates {odd} ahoy")], IGOptions(n_steps=16, precision="fp32"))
    s = report["samples"][0]
    assert s["words"] == ["pirates", "[UNK]", "ahoy"]
    unk_pos = s["tokens"].index("[UNK]")
    assert s["token_attributions"][unk_pos] != 0.0
    assert s["relative_delta"] < 2e-2


def test_attributed_history_is_truncated_like_score_texts() -> None:
    model = _word_nrms()
    history = [f"topic{i} headline" for i in range(80)]  # more than max_history = 50
    report = explain(model, [Sample("u", history, "Lakers beat Celtics")],
                     IGOptions(n_steps=4, method="riemann_right", precision="fp32"))
    with torch.no_grad():
        own = float(model.score_texts(history, ["Lakers beat Celtics"])[0])
        everything = float(model.score_texts(history, ["Lakers beat Celtics"], max_history=80)[0])
    assert report["samples"][0]["score"] == pytest.approx(own, rel=1e-5, abs=1e-6)
    assert own != pytest.approx(everything, rel=1e-6)  # the truncation is real


def test_byte_level_bpe_words_are_grouped_by_word_ids(tmp_path: Path) -> None:
    enc_dir = tiny_roberta(tmp_path / "roberta")
    tok = BertNewsTokenizer(enc_dir)
    title = "Astronomers unveil overtime smartphones"
    ids = tok.hf(title)["input_ids"]
    assert len(ids) > len(title.split()) + 2  # some words are split into several BPE pieces
    assert tok.hf.unk_token_id not in tok.special_ids and tok.hf.bos_token_id in tok.special_ids
    torch.manual_seed(0)
    model = build_model({"kind": "nrms", "encoder": "bert", "pretrained": str(enc_dir), "heads": 2,
                         "head_dim": 4, "query_dim": 8, "dropout": 0.0}).eval()
    report = explain(model, [Sample("u", HISTORY, title)], IGOptions(n_steps=32, precision="fp32"))
    s = report["samples"][0]
    assert s["words"] == title.split()
    assert sum(s["word_attributions"]) == pytest.approx(s["attribution_sum"], rel=1e-9, abs=1e-12)
    assert s["relative_delta"] < 1e-3


def test_pairwise_csv_history_bodies_column(tmp_path: Path) -> None:
    path = tmp_path / "pairs_test.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["user_id", "history_titles", "history_bodies", "candidate_id", "candidate_title",
                    "candidate_body"])
        w.writerow(["U1", json.dumps(HISTORY), json.dumps(["b1", "b2"]), "N9", "Tax bill passes", "cb"])
    (s,) = list(iter_pairs(path))
    assert s.history_bodies == ["b1", "b2"] and s.candidate_body == "cb" and s.label is None
    (t,) = load_samples(tmp_path, "test", 1, with_bodies=True)
    assert t.history_bodies == ["b1", "b2"]


def test_reservoir_is_uniform_and_mind_sampling_streams(tmp_path: Path) -> None:
    counts = [0] * 10
    for seed in range(2000):
        for x in reservoir_sample(range(10), 3, random.Random(seed)):
            counts[x] += 1
    assert all(abs(c - 600) < 100 for c in counts)  # kept with probability 3/10: 600 +- 5 sigma
    split = tmp_path / "large"
    split.mkdir()
    with open(split / "news.tsv", "w") as fh:
        for i in range(200):
            fh.write(f"N{i}\tsports\tsports\tHeadline number {i}\tBody\t\t[]\t[]\n")
    with open(split / "behaviors.tsv", "w") as fh:
        for i in range(40000):
            hist = " ".join(f"N{(i + k) % 200}" for k in range(20))
            fh.write(f"{i}\tU{i}\t11/11/2019 9:00:00 AM\t{hist}\tN{i % 200}-1 N{(i + 7) % 200}-0\n")
    size = (split / "behaviors.tsv").stat().st_size
    tracemalloc.start()
    samples = sample_mind(split, 16, seed=3)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(samples) == 16 and len({s.id for s in samples}) == 16
    assert [s.id for s in sample_mind(split, 16, seed=3)] == [s.id for s in samples]
    assert peak < size / 10, (peak, size)  # far below the file size: the file is streamed


def test_roberta_encoder_fine_tuned_last_layer_is_bundled_in_the_checkpoint(tmp_path: Path) -> None:
    import shutil

    from models.news import checkpoint
    from models.news.train import TrainConfig, train

    enc_dir = tiny_roberta(tmp_path / "roberta")
    torch.manual_seed(0)
    model = build_model({"kind": "nrms", "encoder": "bert", "pretrained": str(enc_dir), "fine_tune": True,
                         "fine_tune_layers": 1, "heads": 2, "head_dim": 4, "query_dim": 8, "dropout": 0.0})
    bert = model.token_encoder.bert
    assert not bert.embeddings.word_embeddings.weight.requires_grad
    assert all(p.requires_grad for p in bert.encoder.layer[-1].parameters())
    before = bert.encoder.layer[-1].output.dense.weight.detach().clone()
    root = mind_dir(tmp_path / "mind", n_news=200, n_users=10)
    result = train(model, read_mind(root / "train"), read_mind(root / "valid"),
                   TrainConfig(epochs=1, batch_size=8, lr=1e-2, negatives=2))
    assert {"auc", "pooled_auc", "mrr", "ndcg@5", "ndcg@10"} <= set(result["valid"])
    assert not torch.equal(before, bert.encoder.layer[-1].output.dense.weight)
    checkpoint.save(model, tmp_path / "ckpt")
    shutil.rmtree(enc_dir)  # the checkpoint must not need the source directory any more
    loaded = checkpoint.load(tmp_path / "ckpt").model
    with torch.no_grad():
        a = model.eval().score_texts(HISTORY, ["Apple unveils new smartphone"])
        b = loaded.score_texts(HISTORY, ["Apple unveils new smartphone"])
    assert torch.allclose(a, b, atol=1e-5)


def test_pairwise_csv_becomes_impressions_for_training(tmp_path: Path) -> None:
    from models.news.data import generate_synthetic, read_split

    generate_synthetic(tmp_path / "d", n_news=120, n_users=12, impressions_per_user=2, seed=0)
    (tmp_path / "csv").mkdir()
    (tmp_path / "d" / "pairs_train.csv").rename(tmp_path / "csv" / "pairs_train.csv")
    mind, pairs = read_split(tmp_path / "d", "train"), read_split(tmp_path / "csv", "train")

    def clicks(split) -> list:
        return sorted((imp.user, split.news[n].title, lab, split.news[n].fake)
                      for imp in split.behaviors for n, lab in imp.candidates)

    assert clicks(pairs) == clicks(mind)
    assert {tuple(split_titles) for split_titles in
            ([pairs.news[h].title for h in imp.history] for imp in pairs.behaviors)} == \
        {tuple(mind.news[h].title for h in imp.history) for imp in mind.behaviors}


def test_pickle_shapes_reads_state_dicts_without_running_the_file(tmp_path):
    import collections
    import os

    import torch

    from models.weight_files import pickle_shapes

    sd = collections.OrderedDict(a=torch.zeros(3, 4), b=torch.nn.Parameter(torch.ones(5)))
    torch.save(sd, tmp_path / "m.pt")
    torch.save({"state_dict": sd, "epoch": 3}, tmp_path / "w.pt")
    assert pickle_shapes(tmp_path / "m.pt") == pickle_shapes(tmp_path / "w.pt") == {"a": (3, 4), "b": (5,)}
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"x": Payload()}, tmp_path / "evil.pt")
    assert pickle_shapes(tmp_path / "evil.pt") is None and not marker.exists()
    (tmp_path / "not-a-zip.pt").write_bytes(b"garbage")
    assert pickle_shapes(tmp_path / "not-a-zip.pt") is None
