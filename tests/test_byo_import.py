"""Bring your own model: ``POST /models/import`` of a ConvE in the TracIn guide's layout (``model.pt`` with
``node_dict`` / ``rel_dict``) and with PyKEEN's id files but this project's tensor names (safetensors; PyKEEN's own
weights are tests/test_pykeen_interop.py), name/shape checks, weights-only loading,
TracIn with ``test_triples_path``; NRMS and Vision-BDH imports (real Redis, a real worker)."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from models.kg.checkpoint import load as load_conve
from models.kg.train import TrainConfig, train_conve
from models.kg.triples import load_nations

ALICE = {"Authorization": "Bearer key-a"}
BOB = {"Authorization": "Bearer key-b"}
REFERENCE_NAMES = {"ent.": "emb_e.", "rel.": "emb_rel.", "conv.": "conv1."}
SHAPE = {"embedding_dim": 20, "embedding_height": 4, "num_filters": 4}


def _reference_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The reference ConvE code's tensor names (emb_e, emb_rel, conv1, b)."""
    out = {}
    for k, v in state.items():
        for ours, theirs in REFERENCE_NAMES.items():
            if k.startswith(ours):
                k = theirs + k[len(ours):]
        out["b" if k == "ent_bias" else k] = v.clone()
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """A ConvE trained elsewhere, written in two layouts under the data root."""
    work = tmp_path_factory.mktemp("conve-src")
    cfg = TrainConfig(epochs=2, batch_size=256, lr=0.01, checkpoint_every=1, seed=2, **SHAPE)
    ds = load_nations()
    train_conve(ds, cfg, work / "trained", device="cpu")
    bundle = load_conve(work / "trained")
    data = tmp_path_factory.mktemp("byo-import-home") / "data"
    guide = data / "guide"
    guide.mkdir(parents=True)
    torch.save(_reference_state(bundle.model.state_dict()), guide / "model.pt")
    # the legacy (pre-zip) pickle format: the API cannot read its shapes, the import job checks them
    torch.save(_reference_state(bundle.model.state_dict()), guide / "legacy.pt", _use_new_zipfile_serialization=False)
    for i, c in enumerate(bundle.checkpoints):
        torch.save({"state_dict": _reference_state(c.state_dict())}, guide / f"checkpoint_{i + 1}.pt")
    torch.save({"state_dict": _reference_state(bundle.checkpoints[0].state_dict())}, guide / "legacy_checkpoint.pt",
               _use_new_zipfile_serialization=False)
    (guide / "node_dict").write_text("".join(f"{n}\t{i}\n" for i, n in enumerate(ds.entities.names)))
    (guide / "rel_dict").write_text("".join(f"{n}\t{i}\n" for i, n in enumerate(ds.relations.names)))
    (guide / "config.json").write_text(json.dumps(SHAPE))
    rows = ds.decode(ds.train)
    (guide / "train.txt").write_text("".join("\t".join(r) + "\n" for r in rows))
    (guide / "test_batch.tsv").write_text("".join("\t".join(r) + "\n" for r in ds.decode(ds.test)[:3]))
    pykeen = data / "pykeen"
    pykeen.mkdir()
    save_file({k: v.contiguous() for k, v in bundle.model.state_dict().items()}, str(pykeen / "model.safetensors"))
    for fname, names in (("entity_to_id.tsv.gz", ds.entities.names), ("relation_to_id.tsv.gz", ds.relations.names)):
        with gzip.open(pykeen / fname, "wt") as fh:
            fh.write("id\tlabel\n" + "".join(f"{i}\t{n}\n" for i, n in enumerate(names)))
    (pykeen / "train.txt").write_text((guide / "train.txt").read_text())
    # a pickle that needs code to load: refused by weights_only
    (guide / "evil.pt").write_bytes(pickle.dumps({"x": Path("/")}))
    return {"data": data, "guide": guide, "pykeen": pykeen, "home": data.parent, "bundle": bundle}


@pytest.fixture(scope="module")
def svc(sources):
    from tests.service import Service

    with Service(sources["home"], heartbeat_ttl_s=30, api_keys="alice:key-a,bob:key-b") as service:
        yield service


def _import(svc, body: dict, headers=ALICE, ok: bool = True) -> dict:
    r = svc.client.post("/models/import", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300, headers=headers)
    if not ok:
        assert job["status"] == "failed", job
        return job
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return svc.client.get(f"/jobs/{job['id']}/result", headers=headers).json()


def test_import_conve_guide_layout_then_tracin(svc, sources) -> None:
    ckpts = [{"file": "checkpoint_1.pt", "lr": 0.01, "epoch": 1}, {"file": "checkpoint_2.pt", "lr": 0.005}]
    res = _import(svc, {"name": "kg-guide", "kind": "conve", "path": "guide", "weights": "model.pt",
                        "checkpoints": ckpts})
    bundle = sources["bundle"]
    assert res["parameters"] == bundle.parameters and res["entities"] == len(bundle.dataset.entities)
    assert res["reciprocal"] is True and [c["lr"] for c in res["checkpoints"]] == [0.01, 0.005]
    assert res["smoke"]["hits@10"] > 0.3  # a trained model ranks its training triples high
    r = svc.client.post("/tracin", headers=ALICE, json={"model": "kg-guide", "test_triples_path":
                                                        "guide/test_batch.tsv", "top_k": 3})
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300, headers=ALICE)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    result = svc.client.get(f"/jobs/{job['id']}/result", headers=ALICE).json()
    tests = [r["test_triple"] for r in result["results"]]
    assert tests == [line.split("\t") for line in (sources["guide"] / "test_batch.tsv").read_text().splitlines()]
    assert all(len(r["proponents"]) == 3 for r in result["results"])
    r = svc.client.post("/tracin", headers=ALICE, json={"model": "kg-guide", "test_triples_path": "guide/nope.tsv"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "test_triples_path"]


def test_import_conve_pykeen_ids_safetensors_and_checks(svc, sources) -> None:
    res = _import(svc, {"name": "kg-pykeen", "kind": "conve", "path": "pykeen", "config": SHAPE,
                        "checkpoints": [{"file": "model.safetensors", "lr": 0.01}]})
    assert res["entities"] == len(sources["bundle"].dataset.entities)
    # safetensors: the API reads the header and answers 422 naming the tensors
    r = svc.client.post("/models/import", headers=ALICE, json={
        "name": "kg-bad", "kind": "conve", "path": "pykeen", "config": {**SHAPE, "embedding_height": 5},
        "checkpoints": [{"file": "model.safetensors", "lr": 0.01}]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "weights"] and "fc.weight" in r.json()["detail"][0]["msg"]
    # .pt: the API reads the pickle's shapes without torch and without running it, and answers 422 too
    r = svc.client.post("/models/import", headers=ALICE, json={
        "name": "kg-bad", "kind": "conve", "path": "guide", "weights": "model.pt",
        "config": {**SHAPE, "embedding_height": 5}, "checkpoints": [{"file": "checkpoint_1.pt", "lr": 0.01}]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "weights"] and "fc.weight" in r.json()["detail"][0]["msg"]
    # a legacy-format pickle: the job unpickles (weights only), checks and fails naming the tensors
    bad = _import(svc, {"name": "kg-bad", "kind": "conve", "path": "guide", "weights": "legacy.pt",
                        "config": {**SHAPE, "embedding_height": 5},
                        "checkpoints": [{"file": "legacy_checkpoint.pt", "lr": 0.01}]}, ok=False)
    assert bad["error"]["code"] == "shape_mismatch" and "fc.weight" in bad["error"]["message"]
    assert "kg-bad" not in {m["name"] for m in svc.client.get("/models", headers=ALICE).json()["models"]}
    evil = _import(svc, {"name": "kg-evil", "kind": "conve", "path": "guide", "weights": "evil.pt",
                         "checkpoints": [{"file": "evil.pt", "lr": 0.01}]}, ok=False)
    assert evil["error"]["code"] == "invalid_model" and "weights_only" in evil["error"]["message"]
    r = svc.client.post("/models/import", headers=ALICE, json={"name": "x", "kind": "conve", "path": "pykeen"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "checkpoints"]
    r = svc.client.post("/models/import", headers=BOB, json={
        "name": "kg-pykeen", "kind": "conve", "path": "pykeen", "config": SHAPE,
        "checkpoints": [{"file": "model.safetensors", "lr": 0.01}]})
    assert r.status_code == 409
    r = svc.client.post("/models/import", headers=ALICE, json={
        "name": "x", "kind": "conve", "path": "pykeen", "checkpoints": [{"file": "../guide/model.pt", "lr": 1}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "checkpoints", 0, "file"]


def test_import_nrms_and_vision_bdh(svc, sources) -> None:
    from models.news import checkpoint
    from models.news.modules import build_model
    from models.news.text import WordTokenizer
    from models.vision.bdh import VisionBDH
    from models.vision.config import Optimizations, VisionBDHConfig

    torch.manual_seed(0)
    tok = WordTokenizer.build(["team wins the final", "senate passes the budget bill", "coach praises defense"])
    cfg = {"kind": "nrms", "encoder": "word", "emb_dim": 8, "heads": 2, "head_dim": 4, "query_dim": 8}
    checkpoint.save(build_model(cfg, tok), sources["data"] / "nrms")
    res = _import(svc, {"name": "my-nrms", "kind": "nrms", "path": "nrms"})
    assert res["smoke"]["finite"] and res["parameters"] > 0
    r = svc.client.post("/attributions", headers=ALICE, json={"model": "my-nrms", "n_steps": 16, "samples": [
        {"id": "a", "history": ["team wins the final"], "candidate": "senate passes the budget bill"}]})
    job = svc.wait(r.json()["id"], timeout_s=200, headers=ALICE)
    assert job["status"] == "succeeded", job
    bdh_cfg = VisionBDHConfig(n_layer=1, n_embd=16, n_head=2, mlp_multiplier=2, img_size=8, patch_size=4,
                              num_classes=3)
    bdh_dir = sources["data"] / "bdh"
    bdh_dir.mkdir()
    torch.save(VisionBDH(bdh_cfg, Optimizations()).state_dict(), bdh_dir / "model.pt")
    (bdh_dir / "config.json").write_text(json.dumps({"model": bdh_cfg.to_dict(), "classes": ["a", "b", "c"]}))
    res = _import(svc, {"name": "my-bdh", "kind": "vision_bdh", "path": "bdh"})
    assert res["smoke"]["logits_shape"] == [2, 3]
    (bdh_dir / "config.json").write_text(json.dumps({"model": {**bdh_cfg.to_dict(), "n_embd": 32}}))
    bad = _import(svc, {"name": "my-bdh2", "kind": "vision_bdh", "path": "bdh"}, ok=False)
    assert bad["error"]["code"] == "shape_mismatch"
    models = {m["name"]: m for m in svc.client.get("/models", headers=ALICE).json()["models"]}
    assert models["my-bdh"]["kind"] == "vision_bdh" and models["my-nrms"]["kind"] == "news"
