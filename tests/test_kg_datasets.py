"""The shipped knowledge graphs (Nations, UMLS, Kinships): their published split sizes and vocabularies, the files'
recorded SHA-256 (equal to the PyKEEN wheel's copies; a damaged copy refused), the loaders' refusals of malformed
files, this project's filtered ranks equal to PyKEEN's evaluator on a tiny model (an independent oracle, filter
included), and demo preparation registering the graphs and their ConvE demos with test metrics next to the
published ConvE figures."""

from __future__ import annotations

import gzip
import hashlib
import re
import shutil
from pathlib import Path

import pytest
import torch

from core import registry
from core.contract.errors import FieldError
from core.kinds.train_conve import SHIPPED_COUNTS, SHIPPED_SPLITS, dataset_counts, resolve_dataset
from models.kg.shipped import SHIPPED, ShippedDataError, shipped_dir, verify_shipped
from models.kg.triples import TriplesFormatError, load_kinships, load_shipped, load_triples_dir, load_umls

# Published split sizes and vocabularies (PyKEEN's dataset statistics; ConvE's and Neural LP's papers agree).
PUBLISHED = {"nations": ((1592, 199, 201), 14, 55), "umls": ((5216, 652, 661), 135, 46),
             "kinships": ((8544, 1068, 1074), 104, 25)}
TINY = {"epochs": 1, "batch_size": 512, "lr": 0.01, "embedding_dim": 32, "embedding_height": 4, "num_filters": 8,
        "checkpoint_every": 1, "seed": 0}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_split_sizes_and_vocabularies_are_the_published_ones(name: str) -> None:
    ds = load_shipped(name)
    (train, valid, test), entities, relations = PUBLISHED[name]
    assert (len(ds.train), len(ds.valid), len(ds.test)) == (train, valid, test)
    assert (len(ds.entities), len(ds.relations)) == (entities, relations)
    graph = SHIPPED[name]
    assert graph.splits == {"train": train, "valid": valid, "test": test}
    assert (graph.entities, graph.relations) == (entities, relations)
    assert SHIPPED_COUNTS[name] == {"entities": entities, "relations": relations}  # the API's table (no torch)
    assert SHIPPED_SPLITS[name] == {"train_triples": train, "test_triples": test}  # the estimates' table
    # every split is id-encoded in one vocabulary; no triple repeats within a split
    for split in ds.splits.values():
        assert int(split[:, [0, 2]].max()) < entities and int(split[:, 1].max()) < relations
        assert len(torch.unique(split, dim=0)) == len(split)


def test_named_loaders() -> None:
    assert len(load_umls().train) == 5216 and load_umls().name == "umls"
    assert len(load_kinships().train) == 8544 and load_kinships().name == "kinships"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_source_md_records_the_hashes_the_loader_checks(name: str) -> None:
    text = (shipped_dir(name) / "SOURCE.md").read_text()
    recorded = dict(re.findall(r"^- (\w+\.txt)\s+([0-9a-f]{64})$", text, re.M))
    assert recorded == SHIPPED[name].sha256
    assert "MIT" in text and "pykeen-1.11.1" in text


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_copies_equal_the_pykeen_wheel(name: str) -> None:
    pykeen = pytest.importorskip("pykeen")
    wheel = Path(pykeen.__file__).parent / "datasets" / name
    for fname, digest in SHIPPED[name].sha256.items():
        assert hashlib.sha256((wheel / fname).read_bytes()).hexdigest() == digest, fname


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(shipped_dir(name), dst)
    return dst


def test_damaged_shipped_file_is_refused_naming_it(tmp_path: Path) -> None:
    src = _copy("umls", tmp_path)
    assert len(load_shipped("umls", src).train) == 5216  # the intact copy loads
    lines = (src / "train.txt").read_text().splitlines(keepends=True)
    (src / "train.txt").write_text("".join(lines[:-1]))  # one triple lost: still a well-formed file
    assert len(load_triples_dir(src).train) == 5215  # ...which the plain reader would take as a smaller graph
    with pytest.raises(ShippedDataError, match=r"umls/train\.txt is damaged.*reinstall") as exc:
        load_shipped("umls", src)
    assert str(tmp_path) not in str(exc.value)  # no server path in the message
    (src / "train.txt").unlink()
    with pytest.raises(ShippedDataError, match=r"umls/train\.txt is missing"):
        verify_shipped("umls", src)
    with pytest.raises(KeyError, match="no shipped dataset 'fb15k'"):
        load_shipped("fb15k")


def test_loader_refuses_malformed_files_naming_file_and_line(tmp_path: Path) -> None:
    d = tmp_path / "kg"
    d.mkdir()
    (d / "train.txt").write_text("a\tr\tb\nb\tr\n")
    with pytest.raises(TriplesFormatError, match=r"train\.txt:2: expected 3 tab-separated fields, got 2"):
        load_triples_dir(d)
    (d / "train.txt").write_text("a\tr\tb\n\t r\tc\n")
    with pytest.raises(TriplesFormatError, match=r"train\.txt:2: a field is empty"):
        load_triples_dir(d)
    # the compressed file some dumps ship, saved under the plain name: a clear error, not a UnicodeDecodeError
    (d / "train.txt").write_bytes(gzip.compress(("a\tr\tb\n" * 50).encode()))
    with pytest.raises(TriplesFormatError, match=r"train\.txt: not UTF-8 text after line 0"):
        load_triples_dir(d)
    (d / "train.txt").write_text("\n\n")
    with pytest.raises(TriplesFormatError, match=r"train\.txt: no triples"):
        load_triples_dir(d)


# --- filtered ranks against PyKEEN's evaluator -------------------------------------------------------------------


def _to_pykeen(model, ours, pk_ds):
    """This project's ConvE as a PyKEEN ConvE on PyKEEN's own dataset (ids matched by name, relation rows in
    PyKEEN's interleaved layout: forward 2r, inverse 2r+1)."""
    from pykeen.models import ConvE as PKConvE

    c = model.config
    pk = PKConvE(triples_factory=pk_ds.training, embedding_dim=c.embedding_dim, output_channels=c.num_filters,
                 embedding_height=c.embedding_height, embedding_width=c.embedding_width, random_seed=0)
    tf = pk_ds.training
    ent = torch.tensor([ours.entities.index[e] for e, _ in sorted(tf.entity_to_id.items(), key=lambda x: x[1])])
    rel = torch.tensor([ours.relations.index[r] for r, _ in sorted(tf.relation_to_id.items(), key=lambda x: x[1])])
    sd = model.state_dict()
    rows = torch.stack([sd["rel.weight"][rel], sd["rel.weight"][rel + c.num_relations]], 1).flatten(0, 1)
    new = {"entity_representations.0._embeddings.weight": sd["ent.weight"][ent],
           "entity_representations.1._embeddings.weight": sd["ent_bias"][ent][:, None],
           "relation_representations.0._embeddings.weight": rows}
    for theirs, mine in (("interaction.hr2d.0", "bn0"), ("interaction.hr2d.2", "conv"), ("interaction.hr2d.3", "bn1"),
                         ("interaction.hr1d.0", "fc"), ("interaction.hr1d.2", "bn2")):
        for k, v in sd.items():
            if k.startswith(mine + "."):
                new[theirs + k[len(mine):]] = v
    pk.load_state_dict(new)
    return pk.eval(), ent


@pytest.mark.parametrize("name", ["umls", pytest.param("kinships", marks=pytest.mark.slow)])
def test_filtered_ranks_equal_pykeen_evaluator(name: str, tmp_path: Path) -> None:
    """Every test query's filtered rank (tail and head, ties counted half) equals PyKEEN's realistic rank, the
    filter built by PyKEEN from all three splits."""
    pytest.importorskip("pykeen")
    import numpy as np
    from pykeen.datasets import UMLS, Kinships
    from pykeen.evaluation import RankBasedEvaluator

    from models.kg.checkpoint import load
    from models.kg.train import FilterIndex, TrainConfig, filtered_ranks, rank_metrics, train_conve

    ours = load_shipped(name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_conve(ours, TrainConfig(**TINY), tmp_path / "m", device="cpu")
        model = load(tmp_path / "m", "cpu").model.eval()
        pk_ds = (UMLS if name == "umls" else Kinships)(create_inverse_triples=True)
        pk_model, ent = _to_pykeen(model, ours, pk_ds)
        # PyKEEN's test triples in this project's ids, in PyKEEN's order
        rel = {r: ours.relations.index[n] for n, r in pk_ds.training.relation_to_id.items()}
        t = pk_ds.testing.mapped_triples.long()
        mapped = torch.stack([ent[t[:, 0]], torch.tensor([rel[int(r)] for r in t[:, 1]]), ent[t[:, 2]]], 1)
        filt = FilterIndex(ours.all_known(), model.config.num_relations, model.config.reciprocal)

        def both() -> tuple[torch.Tensor, torch.Tensor]:
            evaluator = RankBasedEvaluator(filtered=True, clear_on_finalize=False)
            evaluator.evaluate(pk_model, pk_ds.testing.mapped_triples, batch_size=512, use_tqdm=False,
                               additional_filter_triples=[pk_ds.training.mapped_triples,
                                                          pk_ds.validation.mapped_triples])
            theirs = torch.from_numpy(np.concatenate([*evaluator.ranks["tail", "realistic"],
                                                      *evaluator.ranks["head", "realistic"]])).float()
            return filtered_ranks(model, mapped, filt), theirs

        mine, theirs = both()
        # every score tied (a zero entity table and bias): the ranks are the tie rule and the filter's counts alone
        with torch.no_grad():
            for p in (model.ent.weight, model.ent_bias, pk_model.entity_representations[0]._embeddings.weight,
                      pk_model.entity_representations[1]._embeddings.weight):
                p.zero_()
        tied_mine, tied_theirs = both()
    finally:
        torch.set_num_threads(threads)
    n = len(mapped)
    assert len(mine) == 2 * n and len(theirs) == 2 * n
    assert torch.equal(mine, theirs), (mine - theirs).abs().max()
    metrics = rank_metrics(mine)
    assert metrics["mrr"] > 2 * rank_metrics(torch.full((1,), len(ours.entities) / 2.0))["mrr"]  # learned something
    assert sorted(map(tuple, mapped.tolist())) == sorted(map(tuple, ours.test.tolist()))  # the same test split
    assert torch.equal(tied_mine, tied_theirs), (tied_mine - tied_theirs).abs().max()
    assert (tied_mine % 1 == 0.5).any() and tied_mine.min() > 1  # half ranks: ties counted half, not first


# --- demo preparation ----------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_demos(monkeypatch):
    from workers.jobs import train_conve as job

    for attr in ("DEMO_CONFIG", "UMLS_DEMO_CONFIG", "KINSHIPS_DEMO_CONFIG"):
        monkeypatch.setattr(job, attr, dict(TINY))
    return job


def test_prepare_demo_registers_the_graphs_and_their_conve_demos(redis_settings, tiny_demos) -> None:
    job = tiny_demos
    assert [(m, d) for m, d, _ in job.demo_models()] == [
        ("conve-nations-demo", "nations"), ("conve-umls-demo", "umls"), ("conve-kinships-demo", "kinships")]
    job.prepare_demo(redis_settings, progress=False)
    for model_name, dataset, _ in job.demo_models():
        ds_entry = registry.get_dataset(redis_settings, dataset)
        (train, valid, test), entities, relations = PUBLISHED[dataset]
        assert ds_entry["kind"] == "triples" and ds_entry["owner"] == "system"
        assert ds_entry["meta"]["counts"] == {"train_triples": train, "valid_triples": valid, "test_triples": test,
                                              "entities": entities, "relations": relations}
        assert dataset_counts(redis_settings, dataset) == {"entities": entities, "relations": relations}
        stored = registry.local_path(redis_settings, ds_entry)
        assert (stored / "SOURCE.md").is_file()
        assert len(load_shipped(dataset, stored).test) == test  # the stored copy is the shipped one
        meta = registry.get_model(redis_settings, model_name)["meta"]
        assert meta["dataset"] == dataset and meta["train_triples"] == train
        assert meta["test_mrr"] == round(meta["metrics"]["test"]["mrr"], 4)
        assert meta["test_hits@10"] == round(meta["metrics"]["test"]["hits@10"], 4)
        assert meta["published_conve_mrr"] == SHIPPED[dataset].published["mrr"]
        assert meta["published_conve_hits@10"] == SHIPPED[dataset].published["hits@10"]
        assert "Dettmers" in meta["published_source"]
    assert registry.get_model(redis_settings, "conve-nations-demo")["preload"]
    assert not registry.get_model(redis_settings, "conve-umls-demo")["preload"]
    assert SHIPPED["umls"].published["mrr"] == 0.94 and SHIPPED["kinships"].published["mrr"] == 0.83
    created = {m: registry.get_model(redis_settings, m)["created_at"] for m, _, _ in job.demo_models()}
    job.prepare_demo(redis_settings, progress=False)  # idempotent: nothing retrained
    assert {m: registry.get_model(redis_settings, m)["created_at"] for m in created} == created
    # what clients see: GET /models with the metrics and the labelled published figures, GET /datasets/<name>
    from fastapi.testclient import TestClient

    from app.main import create_app

    with TestClient(create_app(redis_settings)) as client:
        listed = client.get("/models").json()
        umls = client.get("/datasets/umls").json()
        page = client.get("/ui/models").text
    (model,) = [m for m in listed["models"] if m["name"] == "conve-kinships-demo"]
    assert model["meta"]["published_conve_mrr"] == 0.83 and 0 < model["meta"]["test_mrr"] <= 1
    assert {d["name"] for d in listed["datasets"]} == {"nations", "umls", "kinships"}
    assert umls["kind"] == "triples" and umls["counts"]["train_triples"] == 5216
    row = page[page.index("conve-umls-demo"):]
    row = row[:row.index("</tr>")]
    assert "<b>test_mrr</b>" in row and "<b>published_conve_mrr</b> 0.94" in row, row


def test_prepare_demo_failure_of_one_demo_leaves_the_others(redis_settings, tiny_demos, monkeypatch) -> None:
    job = tiny_demos
    monkeypatch.setattr(job, "UMLS_DEMO_CONFIG", {**TINY, "epochs": 0})
    with pytest.raises(RuntimeError, match="conve-umls-demo"):
        job.prepare_demo(redis_settings, progress=False)
    assert registry.get_model(redis_settings, "conve-umls-demo") is None
    assert registry.get_model(redis_settings, "conve-kinships-demo") is not None
    assert registry.get_dataset(redis_settings, "umls") is not None


def test_prepare_demo_fails_on_a_graph_whose_name_a_tenant_registered_before_it_was_reserved(
        redis_settings, tiny_demos) -> None:
    with pytest.raises(registry.ReservedNameError):
        registry.register_dataset(redis_settings, "umls", kind="triples", path=shipped_dir("nations"), owner="alice")
    _legacy_dataset(redis_settings, "umls", "alice")
    with pytest.raises(RuntimeError, match="conve-umls-demo: dataset 'umls' is reserved .* registered by 'alice'"):
        tiny_demos.prepare_demo(redis_settings, progress=False)
    assert registry.get_model(redis_settings, "conve-umls-demo") is None  # never trained on alice's graph
    assert registry.get_dataset(redis_settings, "umls")["owner"] == "alice"
    assert registry.get_model(redis_settings, "conve-kinships-demo")["meta"]["dataset"] == "kinships"


def test_shipped_names_resolve_before_and_after_registration(redis_settings) -> None:
    from workers.jobs import train_conve as job

    for name in ("umls", "kinships"):
        assert resolve_dataset(redis_settings, name, "alice") is None  # the packaged copy
        assert dataset_counts(redis_settings, name) == SHIPPED_COUNTS[name]
    with pytest.raises(FieldError, match="unknown dataset 'umls2'"):
        resolve_dataset(redis_settings, "umls2", "alice")
    assert job._published_for(redis_settings, "umls", "alice")["published_conve_mrr"] == 0.94
    job.register_shipped_dataset(redis_settings, "umls")
    assert resolve_dataset(redis_settings, "umls", "alice") == registry.local_path(
        redis_settings, registry.get_dataset(redis_settings, "umls"))
    assert job._published_for(redis_settings, "umls", "alice") is not None
    # a tenant's dataset named like a shipped graph (from before the names were reserved) is not that graph: no
    # published figures next to it
    _legacy_dataset(redis_settings, "kinships", "alice")
    assert job._published_for(redis_settings, "kinships", "alice") is None
    assert job._published_for(redis_settings, "my-graph", "alice") is None


def _legacy_dataset(settings, name: str, owner: str) -> None:
    """A tenant's record of a now reserved name, as an older version let them write it."""
    import json

    from core import keys

    entry = {"name": name, "kind": "triples", "owner": owner, "meta": {}, "created_at": "2026-01-01T00:00:00+00:00",
             "path": str(shipped_dir("nations"))}
    registry.connection(settings).hset(keys.registry("datasets"), name, json.dumps(entry))


@pytest.fixture
def one_thread():
    """Tiny models: one thread is several times faster than two contended ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_training_on_a_shipped_name_before_registration_reads_the_packaged_copy(redis_settings, one_thread) -> None:
    """``POST /train/conve`` with ``"dataset": "umls"`` on a service whose demos were never prepared: the worker
    trains on the packaged (verified) copy and records the published figures next to its own."""
    from workers.jobs import train_conve as job

    registered: dict = {}
    out = job._train_and_register(redis_settings, "mine", "umls", dict(TINY), "cpu", owner="alice",
                                  register=lambda name, **entry: registered.update(name=name, **entry),
                                  published=job._published_for(redis_settings, "umls", "alice"))
    assert registry.get_dataset(redis_settings, "umls") is None
    meta = registered["meta"]
    assert registered["name"] == out["model"] == "mine"
    assert (meta["dataset"], meta["entities"], meta["relations"], meta["train_triples"]) == ("umls", 135, 46, 5216)
    assert meta["metrics"]["test"]["n_queries"] == 2 * 661
    assert meta["test_hits@1"] == round(meta["metrics"]["test"]["hits@1"], 4)
    assert meta["published_conve_hits@1"] == 0.92


def test_imported_triples_errors_name_the_file_not_the_server_directory(tmp_path: Path) -> None:
    """The importer reads a model directory's triples locally; its errors (a job's error message) name the file
    alone: a malformed line or a compressed file under the plain name."""
    from models.kg.importer import _encode_triples

    ds = load_shipped("nations")
    bad = tmp_path / "secret-dir" / "train.txt"
    bad.parent.mkdir()
    for content, message in ((b"usa\tembassy\n", r"^train\.txt:1: expected 3"),
                             (gzip.compress(b"usa\tembassy\tuk\n" * 20), r"^train\.txt: not UTF-8 text")):
        bad.write_bytes(content)
        with pytest.raises(TriplesFormatError, match=message) as exc:
            _encode_triples(bad, ds)
        assert "secret-dir" not in str(exc.value)
