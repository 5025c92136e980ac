"""A ConvE trained in PyKEEN, saved as PyKEEN users save it, imported through ``POST /models/import`` (real Redis, a
real worker): the imported model's filtered MRR and Hits@1/3/10 on the test triples equal PyKEEN's own
``RankBasedEvaluator`` (filtered, realistic rank, both sides) on the same model; this project's evaluation equals
PyKEEN's on a hand-converted copy (an oracle independent of the importer); TracIn on the imported model equals TracIn
on the hand-converted copy; a pickled PyKEEN model is a 422 naming the export line; the relation rows, which PyKEEN
interleaves (forward 2r, inverse 2r+1), are reordered, and a test shows the metrics would catch it if they were not.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pykeen = pytest.importorskip("pykeen")

ALICE = {"Authorization": "Bearer key-a"}
DIM, HEIGHT, WIDTH, FILTERS = 32, 4, 8, 8
METRICS = {"mrr": "inverse_harmonic_mean_rank", "hits@1": "hits_at_1", "hits@3": "hits_at_3",
           "hits@10": "hits_at_10"}
TOL = 1e-4


def _pykeen_metrics(model, ds) -> dict[str, float]:
    from pykeen.evaluation import RankBasedEvaluator

    result = RankBasedEvaluator(filtered=True).evaluate(
        model, ds.testing.mapped_triples, batch_size=256, use_tqdm=False,
        additional_filter_triples=[ds.training.mapped_triples, ds.validation.mapped_triples])
    return {k: float(result.get_metric(f"both.realistic.{v}")) for k, v in METRICS.items()}


def hand_convert(sd: dict[str, torch.Tensor], reorder: bool = True) -> dict[str, torch.Tensor]:
    """PyKEEN ConvE -> this project's names, written out independently of models.kg.importer."""
    rel = sd["relation_representations.0._embeddings.weight"]
    out = {"ent.weight": sd["entity_representations.0._embeddings.weight"],
           "ent_bias": sd["entity_representations.1._embeddings.weight"][:, 0],
           "rel.weight": torch.cat([rel[0::2], rel[1::2]]) if reorder else rel}
    for ours, theirs in (("bn0", "interaction.hr2d.0"), ("conv", "interaction.hr2d.2"), ("bn1", "interaction.hr2d.3"),
                         ("fc", "interaction.hr1d.0"), ("bn2", "interaction.hr1d.2")):
        for k, v in sd.items():
            if k.startswith(theirs + "."):
                out[ours + k[len(theirs):]] = v
    return out


def _explainq_dataset(ds):
    from models.kg.triples import TriplesDataset, Vocab

    tf = ds.training
    ents = Vocab([e for e, _ in sorted(tf.entity_to_id.items(), key=lambda x: x[1])])
    rels = Vocab([r for r, _ in sorted(tf.relation_to_id.items(), key=lambda x: x[1])])
    return TriplesDataset("nations-pykeen", ents, rels, {
        "train": tf.mapped_triples.long(), "valid": ds.validation.mapped_triples.long(),
        "test": ds.testing.mapped_triples.long()})


def _explainq_model(sd, ds, reorder: bool = True):
    from models.kg.conve import ConvE, ConvEConfig

    model = ConvE(ConvEConfig(num_entities=ds.num_entities, num_relations=ds.training.real_num_relations,
                              embedding_dim=DIM, embedding_height=HEIGHT, num_filters=FILTERS))
    model.load_state_dict(hand_convert(sd, reorder))
    return model.eval()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A ConvE trained in PyKEEN on Nations with inverse triples, saved in the forms PyKEEN users have."""
    os.environ.setdefault("PYSTOW_HOME", str(tmp_path_factory.mktemp("pystow")))
    from pykeen.datasets import Nations
    from pykeen.pipeline import pipeline

    ds = Nations(create_inverse_triples=True)
    data = tmp_path_factory.mktemp("pykeen-home") / "data"
    src = data / "pk"
    src.mkdir(parents=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is several times faster than contended ones
    try:
        result = pipeline(
            dataset=ds, model="ConvE", training_loop="lcwa", random_seed=0, device="cpu",
            model_kwargs=dict(embedding_dim=DIM, embedding_height=HEIGHT, embedding_width=WIDTH,
                              output_channels=FILTERS),
            optimizer_kwargs=dict(lr=0.01),
            training_kwargs=dict(num_epochs=10, batch_size=128, use_tqdm=False, checkpoint_name="checkpoint.pt",
                                 checkpoint_directory=str(src), checkpoint_frequency=0),
            evaluator_kwargs=dict(filtered=True), evaluation_kwargs=dict(use_tqdm=False))
    finally:
        torch.set_num_threads(threads)
    model = result.model.eval()
    torch.save(model.state_dict(), src / "model.pt")  # what PyKEEN users export
    torch.save(model, src / "full_model.pt")  # a pickled model: refused
    ds.training.to_path_binary(src / "training_triples")  # entity_to_id.tsv.gz, relation_to_id.tsv.gz
    for split, tf in (("train", ds.training), ("valid", ds.validation), ("test", ds.testing)):
        (src / f"{split}.txt").write_text("".join("\t".join(row) + "\n" for row in tf.triples))
    (data / "pk-json").mkdir()
    for f in ("model.pt", "train.txt", "valid.txt", "test.txt"):
        (data / "pk-json" / f).write_bytes((src / f).read_bytes())
    (data / "pk-ck").mkdir()
    for f in ("checkpoint.pt", "train.txt", "valid.txt", "test.txt"):
        (data / "pk-ck" / f).write_bytes((src / f).read_bytes())
    (data / "pk-json" / "entity_to_id.json").write_text(json.dumps(ds.training.entity_to_id))
    (data / "pk-json" / "relation_to_id.json").write_text(json.dumps(ds.training.relation_to_id))
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"ds": ds, "model": model, "sd": sd, "data": data, "home": data.parent, "src": src,
            "pykeen": _pykeen_metrics(model, ds)}


@pytest.fixture(scope="module")
def svc(trained):
    from tests.service import Service

    with Service(trained["home"], heartbeat_ttl_s=30, api_keys="alice:key-a") as service:
        yield service


def _import(svc, body: dict) -> dict:
    r = svc.client.post("/models/import", json=body, headers=ALICE)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300, headers=ALICE)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return svc.client.get(f"/jobs/{job['id']}/result", headers=ALICE).json()


def _assert_equal(ours: dict, theirs: dict, what: str) -> None:
    table = "\n".join(f"{k:8s} explainq {ours[k]:.6f}  PyKEEN {theirs[k]:.6f}  diff {ours[k] - theirs[k]:+.2e}"
                      for k in METRICS)
    print(f"\n{what}\n{table}")
    assert all(abs(ours[k] - theirs[k]) <= TOL for k in METRICS), table


def test_explainq_evaluation_equals_pykeen_evaluator(trained) -> None:
    """The oracle: this project's filtered evaluation of a hand-converted copy equals PyKEEN's evaluator."""
    from models.kg.train import evaluate

    ds = trained["ds"]
    ours = evaluate(_explainq_model(trained["sd"], ds), _explainq_dataset(ds), ("test",))["test"]
    _assert_equal(ours, trained["pykeen"], "hand-converted copy vs PyKEEN RankBasedEvaluator")
    assert ours["n_queries"] == 2 * ds.testing.num_triples
    assert trained["pykeen"]["mrr"] > 0.4  # a trained model, not a constant scorer


def test_interleaved_relation_rows_would_be_caught(trained) -> None:
    """The relation rows left in PyKEEN's interleaved order give a model that runs and is wrong: the metric
    comparison above would catch it, and the importer's reordering is what makes them agree."""
    from models.kg.importer import from_pykeen
    from models.kg.train import evaluate

    ds = trained["ds"]
    wrong = evaluate(_explainq_model(trained["sd"], ds, reorder=False), _explainq_dataset(ds), ("test",))["test"]
    print(f"\nrelation rows left interleaved: MRR {wrong['mrr']:.4f}, PyKEEN {trained['pykeen']['mrr']:.4f}")
    assert abs(wrong["mrr"] - trained["pykeen"]["mrr"]) > 0.02, (wrong, trained["pykeen"])
    mapped = from_pykeen(trained["sd"], ds.training.real_num_relations, "model.pt")
    rel = trained["sd"]["relation_representations.0._embeddings.weight"]
    n = ds.training.real_num_relations
    assert torch.equal(mapped["rel.weight"][:n], rel[0::2]) and torch.equal(mapped["rel.weight"][n:], rel[1::2])
    assert all(torch.equal(v, hand_convert(trained["sd"])[k]) for k, v in mapped.items())


@pytest.mark.parametrize("form", ["state_dict", "checkpoint", "json_maps", "checkpoint_maps"])
def test_import_pykeen_metrics_equal_pykeen(svc, trained, form) -> None:
    body = {"name": f"pk-{form.replace('_', '-')}", "kind": "conve", "path": "pk", "weights": "model.pt",
            "valid_triples": "valid.txt", "test_triples": "test.txt",  # the filter: train, valid and test
            "checkpoints": [{"file": "model.pt", "lr": 0.01}]}
    if form == "checkpoint":  # PyKEEN's training-loop checkpoint (pickle protocol 5, numpy random state)
        body.update(weights="checkpoint.pt", checkpoints=[{"file": "checkpoint.pt", "lr": 0.01}])
    if form == "json_maps":
        body["path"] = "pk-json"
    if form == "checkpoint_maps":  # no id files: the checkpoint's entity_to_id_dict / relation_to_id_dict
        body.update(path="pk-ck", weights="checkpoint.pt", checkpoints=[{"file": "checkpoint.pt", "lr": 0.01}])
    res = _import(svc, body)
    assert res["pykeen"] is True and res["reciprocal"] is True and res["relations"] == 55
    _assert_equal(res["metrics"]["test"], trained["pykeen"], f"imported ({form}) vs PyKEEN RankBasedEvaluator")


def test_pykeen_full_model_pickle_is_422(svc, trained) -> None:
    r = svc.client.post("/models/import", headers=ALICE, json={
        "name": "pk-full", "kind": "conve", "path": "pk", "weights": "full_model.pt",
        "checkpoints": [{"file": "model.pt", "lr": 0.01}]})
    assert r.status_code == 422, r.text
    msg = r.json()["detail"][0]["msg"]
    assert "PyKEEN" in msg and 'torch.save(model.state_dict(), "model.pt")' in msg
    # a PyKEEN state dict that does not fit the config given: the API reads its shapes (no torch) and says PyKEEN
    r = svc.client.post("/models/import", headers=ALICE, json={
        "name": "pk-bad", "kind": "conve", "path": "pk", "weights": "model.pt", "config": {"embedding_height": 2},
        "checkpoints": [{"file": "model.pt", "lr": 0.01}]})
    assert r.status_code == 422, r.text
    msg = r.json()["detail"][0]["msg"]
    assert "model.pt (PyKEEN ConvE)" in msg and "fc.weight" in msg


def test_pykeen_messages_name_pykeen(tmp_path, trained) -> None:
    from models.kg.importer import ImportError_, import_conve

    src = tmp_path / "src"
    src.mkdir()
    for f in ("train.txt",):
        (src / f).write_bytes((trained["src"] / f).read_bytes())
    (src / "relation_to_id.json").write_text(json.dumps(trained["ds"].training.relation_to_id))
    (src / "entity_to_id.json").write_text(json.dumps(trained["ds"].training.entity_to_id))
    sd = dict(trained["sd"])
    sd["relation_representations.0._embeddings.weight"] = sd["relation_representations.0._embeddings.weight"][:-3]
    torch.save(sd, src / "model.pt")
    with pytest.raises(ImportError_, match="PyKEEN.*relation rows"):
        import_conve(src, tmp_path / "out", {"weights": "model.pt", "train_triples": "train.txt", "checkpoints": [{"file": "model.pt", "lr": 1}]})
    torch.save({k: v for k, v in trained["sd"].items() if not k.startswith("interaction.hr2d.3")}, src / "model.pt")
    with pytest.raises(ValueError, match="PyKEEN ConvE"):
        import_conve(src, tmp_path / "out", {"weights": "model.pt", "train_triples": "train.txt", "checkpoints": [{"file": "model.pt", "lr": 1}]})


def test_tracin_imported_equals_hand_converted(tmp_path, trained) -> None:
    """TracIn (self-influence and test influence) on the imported model equals TracIn on a hand-converted copy."""
    from models.kg.checkpoint import KGBundle, load, save_checkpoint, write_model_dir
    from models.kg.importer import import_conve
    from models.kg.influence import plan, score_self, score_test

    src = trained["src"]
    import_conve(src, tmp_path / "imported", {"weights": "model.pt", "train_triples": "train.txt",
                                              "checkpoints": [{"file": "checkpoint.pt", "lr": 0.01}]})
    imported = load(tmp_path / "imported")
    ds = trained["ds"]
    hand = _explainq_model(trained["sd"], ds)
    eq_ds = _explainq_dataset(ds)
    (tmp_path / "hand" / "checkpoints").mkdir(parents=True)
    ck = save_checkpoint(hand, tmp_path / "hand" / "checkpoints" / "epoch_0001.safetensors", 1, 0.01)
    write_model_dir(tmp_path / "hand", hand, eq_ds, [ck], {}, {})
    hand_bundle: KGBundle = load(tmp_path / "hand")
    test = ds.testing.triples[:3].tolist()
    results, entries = [], []
    for bundle in (imported, hand_bundle):
        p = plan(bundle, test, mode="self", top_k=None, precision="fp32", device="cpu")
        p.union = p.union[:64]
        results.append(score_self(p, bundle)[1])
        p = plan(bundle, test, mode="test", top_k=5, precision="fp32", device="cpu")
        entries.append(score_test(p, bundle, top_k=5))
    torch.testing.assert_close(results[0], results[1], rtol=1e-5, atol=1e-6)
    assert results[0].abs().sum() > 0
    assert len(entries[0]) == 3
    for a, b in zip(*entries, strict=True):
        assert a["test_triple"] == b["test_triple"]
        for side in ("proponents", "opponents"):
            assert len(a[side]) == len(b[side]) and len(a["proponents"]) == 5
            assert [x["train_triple"] for x in a[side]] == [x["train_triple"] for x in b[side]]
            torch.testing.assert_close(torch.tensor([x["influence"] for x in a[side]]),
                                       torch.tensor([x["influence"] for x in b[side]]), rtol=1e-5, atol=1e-6)


def test_checkpoint_unpickler_refuses_other_globals(tmp_path, trained) -> None:
    """The checkpoint reader allow-lists what a training checkpoint holds; anything else is refused, not run."""
    import pickle

    from models.weight_files import load_checkpoint_pickle, load_state_file

    ck = load_checkpoint_pickle(trained["src"] / "checkpoint.pt")
    assert set(ck["model_state_dict"]) == set(trained["sd"]) and ck["relation_to_id_dict"]

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    torch.save({"model_state_dict": trained["sd"], "x": Boom()}, tmp_path / "evil.pt", pickle_protocol=5)
    with pytest.raises(pickle.UnpicklingError, match="not part of a training checkpoint"):
        load_checkpoint_pickle(tmp_path / "evil.pt")
    with pytest.raises(ValueError, match="weights_only=True"):
        load_state_file(tmp_path / "evil.pt")
    assert not (tmp_path / "ran").exists()
