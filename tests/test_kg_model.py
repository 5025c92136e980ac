"""Triples loading, ConvE, training with checkpoints, filtered metrics, the n-hop filter and TracIn reports."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from models.kg.checkpoint import load
from models.kg.conve import ConvE, ConvEConfig, query_loss, triple_loss
from models.kg.graph import AdjacencyIndex
from models.kg.influence import CSV_COLUMNS, FilterSpec, tracin_report, write_csv
from models.kg.train import FilterIndex, TrainConfig, evaluate, ranks_from_scores, train_conve
from models.kg.triples import TriplesFormatError, load_nations, load_triples_dir, nations_dir, read_id_dict


def test_nations_is_the_public_split():
    ds = load_nations()
    assert (len(ds.entities), len(ds.relations)) == (14, 55)
    assert {k: len(v) for k, v in ds.splits.items()} == {"train": 1592, "valid": 199, "test": 201}
    assert (nations_dir() / "SOURCE.md").read_text().count("pykeen") >= 1
    assert ds.decode(ds.encode([["usa", "embassy", "uk"]])) == [["usa", "embassy", "uk"]]
    with pytest.raises(KeyError, match="atlantis"):
        ds.encode([["atlantis", "embassy", "uk"]])


def test_directory_with_dictionaries_and_labels(tmp_path):
    (tmp_path / "train.txt").write_text("a\tlikes\tb\nb\tlikes\tc\n")
    (tmp_path / "test.txt").write_text("a\tlikes\tc\n")
    (tmp_path / "entities.dict").write_text("0\tc\n1\ta\n2\tb\n")  # id<TAB>name order is recognised
    (tmp_path / "relations.dict").write_text("likes\t0\n")
    (tmp_path / "entity_labels.tsv").write_text("a\tAlice\n")
    ds = load_triples_dir(tmp_path)
    assert ds.entities.names == ["c", "a", "b"]
    assert ds.train.tolist() == [[1, 0, 2], [2, 0, 0]]
    assert ds.entity_label("a") == "Alice" and ds.entity_label("b") == "b"
    (tmp_path / "valid.txt").write_text("a\tlikes\n")
    with pytest.raises(TriplesFormatError, match="valid.txt:1"):
        load_triples_dir(tmp_path)
    (tmp_path / "bad.dict").write_text("x\t0\ny\t2\n")
    with pytest.raises(TriplesFormatError, match="without gaps"):
        read_id_dict(tmp_path / "bad.dict")


def test_conve_shapes_parameter_count_and_loss():
    cfg = ConvEConfig(14, 55)  # the paper's 200 = 10 x 20 set-up, reciprocal relations
    model = ConvE(cfg).eval()
    assert sum(p.numel() for p in model.parameters()) == 2_099_400
    assert cfg.flat_dim == 32 * 18 * 18
    h, r, t = torch.tensor([0, 3]), torch.tensor([1, 60]), torch.tensor([5, 2])
    logits = model(h, r)
    assert logits.shape == (2, 14)
    y = (1 - cfg.label_smoothing) * torch.nn.functional.one_hot(t, 14).float() + 1 / 14
    manual = -(y * torch.log(torch.sigmoid(logits)) + (1 - y) * torch.log(1 - torch.sigmoid(logits))).mean(1)
    assert torch.allclose(query_loss(logits, t, cfg.label_smoothing), manual, atol=1e-6)
    trip = torch.tensor([[0, 1, 5]])
    both = triple_loss(model, trip)
    fwd = query_loss(model(trip[:, 0], trip[:, 1]), trip[:, 2], cfg.label_smoothing)
    inv = query_loss(model(trip[:, 2], trip[:, 1] + 55), trip[:, 0], cfg.label_smoothing)
    assert torch.allclose(both, fwd + inv)


def test_filtered_ranks():
    scores = torch.tensor([[0.9, 0.5, 0.7, 0.7, 0.1], [1.0, 1.0, 1.0, 1.0, 1.0]])
    target = torch.tensor([2, 0])
    known = torch.zeros(2, 5, dtype=torch.bool)
    known[0, 0] = True  # another true answer, filtered out
    # row 0: 0.9 filtered; tie with index 3 counts half -> 1.5; row 1: constant scores -> mean rank 3
    assert ranks_from_scores(scores, target, known).tolist() == [1.5, 3.0]
    filt = FilterIndex(torch.tensor([[0, 0, 1], [0, 0, 2]]), num_relations=1, reciprocal=True)
    m = filt.mask(torch.tensor([[0, 0, 1], [2, 1, 0]]), 3)
    assert m.tolist() == [[False, True, True], [True, False, False]]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("m")
    cfg = TrainConfig(epochs=4, batch_size=256, lr=0.01, lr_decay=0.5, embedding_dim=20, embedding_height=4,
                      num_filters=4, checkpoint_every=2, seed=0)
    summary = train_conve(load_nations(), cfg, out, device="cpu")
    return out, summary


def test_training_saves_checkpoints_with_epoch_and_lr(trained):
    out, summary = trained
    assert [(c["epoch"], c["lr"]) for c in summary["checkpoints"]] == [(2, pytest.approx(0.005)),
                                                                      (4, pytest.approx(0.00125))]
    for split in ("valid", "test"):
        m = summary["metrics"][split]
        assert set(m) >= {"mrr", "hits@1", "hits@3", "hits@10"}
        assert 0 < m["hits@1"] <= m["hits@3"] <= m["hits@10"] <= 1 and 1 / 14 <= m["mrr"] <= 1
        assert m["n_queries"] == 2 * (199 if split == "valid" else 201)
    b = load(out, "cpu")
    assert [c.epoch for c in b.checkpoints] == [2, 4] and b.parameters == summary["parameters"]
    assert json.loads((out / "metrics.json").read_text())["test"] == summary["metrics"]["test"]
    # the final weights reload exactly: same metrics
    assert evaluate(b.model, b.dataset)["test"]["mrr"] == pytest.approx(summary["metrics"]["test"]["mrr"])
    assert len(summary["history"]) == 4 and summary["history"][0]["loss"] > summary["history"][-1]["loss"]


def test_training_beats_chance_on_nations(trained):
    # a random scorer has filtered MRR about 0.25 on 14 entities; four tiny epochs already do better
    assert trained[1]["metrics"]["test"]["mrr"] > 0.35


def test_filter_keeps_exactly_the_n_hop_neighbourhood():
    # a - b - c - d - e (path, relation 0), b - f (relation 1), g isolated with a self loop, plus z - a
    names = {n: i for i, n in enumerate("abcdefgz")}
    edges = [("a", 0, "b"), ("b", 0, "c"), ("c", 0, "d"), ("d", 0, "e"), ("b", 1, "f"), ("g", 0, "g"),
             ("z", 0, "a")]
    triples = torch.tensor([[names[h], r, names[t]] for h, r, t in edges])
    adj = AdjacencyIndex(triples, len(names))
    assert adj.degree.tolist() == [2, 3, 2, 2, 1, 1, 1, 1]
    seeds = [names["a"], names["a"]]  # test triple (a, r, a): head and tail
    assert adj.candidates(seeds, 1).tolist() == [0, 6]                 # the edges touching a
    assert adj.candidates(seeds, 2).tolist() == [0, 1, 4, 6]           # + edges touching b
    assert adj.candidates(seeds, 3).tolist() == [0, 1, 2, 4, 6]        # + edges touching c
    # min_degree 2 drops f and z (degree 1); a is kept even at min_degree 3 when preserved
    assert adj.candidates(seeds, 2, min_degree=2).tolist() == [0, 1]
    assert adj.candidates(seeds, 2, min_degree=3).tolist() == [0]
    assert adj.candidates(seeds, 2, min_degree=3, preserve_test_entities=False).tolist() == []
    # two seeds: head c, tail g
    assert adj.candidates([names["c"], names["g"]], 1).tolist() == [1, 2, 5]
    with pytest.raises(ValueError):
        adj.candidates(seeds, 0)


def test_report_modes_topk_and_csv(trained, tmp_path):
    out, _ = trained
    b = load(out, "cpu")
    tests = [["usa", "embassy", "uk"], ["china", "intergovorgs", "usa"]]
    res, rows = tracin_report(b, tests, mode="test", top_k=None, layers="all")
    n_train = len(b.dataset.train)
    assert res["n_candidates"] == n_train
    for r in res["results"]:
        assert r["n_candidates"] == n_train
        assert len(r["proponents"]) == r["n_positive"] and len(r["opponents"]) == r["n_negative"]
        assert r["n_positive"] + r["n_negative"] <= n_train and not r["truncated"]
        infl = [p["influence"] for p in r["proponents"]]
        assert infl == sorted(infl, reverse=True) and all(v > 0 for v in infl)
        assert all(o["influence"] < 0 for o in r["opponents"])
    res3, _ = tracin_report(b, tests, mode="test", top_k=3, layers="all")
    for full, cut in zip(res["results"], res3["results"], strict=True):
        head = full["proponents"][:3]
        # both calls score in the same streaming pass (the same batches): the same triples, the same influences;
        # only a bounded list (top_k) carries each score's breakdown, whose parts sum to the score
        recomputed = ("train_self_influence", "breakdown")
        assert [{k: v for k, v in p.items() if k not in recomputed} for p in cut["proponents"]] == [
            {k: v for k, v in p.items() if k not in recomputed} for p in head]
        for p in cut["proponents"]:
            assert sum(p["breakdown"]["checkpoints"]) == pytest.approx(p["influence"], rel=1e-5, abs=1e-9)
            assert sum(p["breakdown"]["layers"].values()) == pytest.approx(p["influence"], rel=1e-5, abs=1e-9)
        assert cut["n_candidates"] == n_train
        # the full listing recomputes the train self-influence of the listed triples alone (TracIn.self_influence,
        # in other batches than the streaming pass the top-k takes it from), so fp32 summation order may move it by
        # an ulp or so; it is a sum of squared gradient norms (no cancellation): 1e-5 relative is ~100 ulps
        np.testing.assert_allclose([p["train_self_influence"] for p in cut["proponents"]],
                                   [p["train_self_influence"] for p in head], rtol=1e-5, atol=0)
        assert cut["truncated"] == (full["n_positive"] > 3 or full["n_negative"] > 3)
    # the filter restricts candidates to the 1-hop neighbourhood of usa/uk
    resf, _ = tracin_report(b, tests[:1], mode="test", top_k=None, filter=FilterSpec(n_hops=1))
    usa, uk = b.dataset.entities.index["usa"], b.dataset.entities.index["uk"]
    tr = b.dataset.train
    expected = int(((tr[:, 0] == usa) | (tr[:, 2] == usa) | (tr[:, 0] == uk) | (tr[:, 2] == uk)).sum())
    assert resf["results"][0]["n_candidates"] == expected < n_train
    # the filtered scores are the unfiltered scores of the same triples
    full = {tuple(p["train_triple"]): p["influence"] for p in res["results"][0]["proponents"]}
    for p in resf["results"][0]["proponents"]:
        assert p["influence"] == pytest.approx(full[tuple(p["train_triple"])], rel=1e-5)
    # self mode ranks the whole training set
    ress, _ = tracin_report(b, None, mode="self", top_k=5)
    si = [r["self_influence"] for r in ress["ranking"]]
    assert ress["n_candidates"] == n_train and len(si) == 5 and si == sorted(si, reverse=True)
    # single mode
    pair = [["usa", "embassy", "uk"]]
    res1, _ = tracin_report(b, tests[:1], mode="single", train_triples=pair)
    own = res1["results"][0]
    assert own["pairs"][0]["influence"] == pytest.approx(own["self_influence"], rel=1e-5)
    write_csv(rows, tmp_path / "x.csv")
    with open(tmp_path / "x.csv") as fh:
        got = list(csv.DictReader(fh))
    assert list(got[0]) == CSV_COLUMNS and len(got) == len(rows) > 0
    assert got[0]["TestHead"] == "usa" and float(got[0]["TracInScore"]) > 0
