"""Exported text classifiers over token ids through the service: ``POST /models/import`` of a ``.pt2`` whose spec
names its embedding table and vocabulary (a crafted archive or a spec the graph disagrees with is a 422 on the spec's
field), then ``POST /attributions`` over ``inputs`` of token ids: a whole and a sharded run with ``compare_with``
and faithfulness give one result, in the text records' shape, and every request the model cannot take is a 422
naming the field (an id outside the vocabulary names the input and the index)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from core.contract.results.attributions import AttributionResult
from tests.export_fixtures import edit_program, rewrite
from tests.results_compare import assert_renders, assert_same
from tests.token_fixtures import BAG_SPEC, CLS, LABELS, PAD, TRANSFORMER_SPEC, VOCAB, save_token_dir

BAG, BAG_B, TRANSFORMER, NOMASK = "bag-text", "bag-text-b", "tiny-transformer", "bag-nomask"
PER_RUN = {"seconds", "seconds_prepare", "batch_size", "alpha_batch_size", "cpu_seconds", "attribution_seconds",
           "time_ratio"}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tokens-svc")
    data = base / "home" / "data"
    out: dict[str, Path] = {"home": base / "home"}
    out["bag"], _ = save_token_dir(data / "bag", "bag", seed=0)
    out["bag_b"], _ = save_token_dir(data / "bag-b", "bag", seed=1)
    out["transformer"], _ = save_token_dir(data / "transformer", "transformer", seed=0)
    nomask = copy.deepcopy(BAG_SPEC)
    del nomask["input"]["mask_id"]
    out["nomask"], _ = save_token_dir(data / "nomask", "bag", seed=2, spec=nomask)

    def indices_from_mask(program):  # the table is read, but with the attention mask as its indices
        node = next(n for n in program["graph_module"]["graph"]["nodes"]
                    if n["target"] == "torch.ops.aten.embedding.default")
        node["inputs"][1]["arg"] = {"as_tensor": {"name": "mask"}}

    (data / "crafted").mkdir()
    rewrite(out["bag"] / "model.pt2", data / "crafted" / "model.pt2", edit_program(indices_from_mask))
    (data / "crafted" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (data / "crafted" / "spec.json").write_text((out["bag"] / "spec.json").read_text())
    return out


@pytest.fixture(scope="module")
def svc(sources):
    from tests.service import Service

    with Service(sources["home"], heartbeat_ttl_s=30) as service:
        yield service


def _import(svc, body: dict) -> dict:
    r = svc.client.post("/models/import", json=body)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job, svc.worker_logs())
    return svc.client.get(f"/jobs/{r.json()['id']}/result").json()


@pytest.fixture(scope="module")
def imported(svc):
    return {BAG: _import(svc, {"name": BAG, "kind": "export", "path": "bag"}),
            BAG_B: _import(svc, {"name": BAG_B, "kind": "export", "path": "bag-b"}),
            TRANSFORMER: _import(svc, {"name": TRANSFORMER, "kind": "export", "path": "transformer"}),
            NOMASK: _import(svc, {"name": NOMASK, "kind": "export", "path": "nomask"})}


def test_a_token_program_imports_with_its_table_and_vocabulary(svc, imported):
    from core import registry
    from models.export.program import load

    res = imported[BAG]
    assert res["registry_kind"] == "exported_classifier" and res["labels"] == LABELS
    assert res["spec"]["input"]["embedding"] == "embed.weight" and res["spec"]["input"]["vocab_size"] == len(VOCAB)
    assert res["spec"]["input"]["vocabulary"] == "vocab.txt" and res["smoke"]["finite"] is True
    clf = load(registry.local_path(svc.settings, registry.get_model(svc.settings, BAG)))
    assert clf.spec.tokens.words == VOCAB


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"path": "crafted", "config": BAG_SPEC}, ("body", "config", "input", "embedding"),
     "'embed.weight' is not the table of an embedding call whose indices are the input 'ids'; the graph's "
     "embedding calls read 'embed.weight' with indices input 'mask'"),
    ({"path": "crafted"}, ("body", "path"), "spec.json: spec.input.embedding: 'embed.weight' is not the table"),
    ({"path": "transformer", "config": {**TRANSFORMER_SPEC, "input": {**TRANSFORMER_SPEC["input"],
                                                                     "embedding": "positions.weight"}}},
     ("body", "config", "input", "embedding"), "indices are the input 'ids'"),
    ({"path": "transformer", "config": {**TRANSFORMER_SPEC, "input": {**TRANSFORMER_SPEC["input"],
                                                                     "vocabulary": "missing.txt"}}},
     ("body", "config", "input", "vocabulary"), "no file 'missing.txt' inside the model directory"),
])
def test_a_spec_the_graph_disagrees_with_is_a_422_on_its_field(svc, body, loc, says):
    r = svc.client.post("/models/import", json={"name": "refused", "kind": "export", **body})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert tuple(detail["loc"]) == loc and says in detail["msg"], detail
    assert "/tmp" not in r.text


def _inputs() -> list[dict]:
    rows = [[CLS, 3, 4, 5, 6], [CLS, 10, 11, 12, 13, 15, 16, 17], [CLS, 19, 20, 21, 22, PAD], [CLS, 7, 9],
            [CLS, 8, 18, 14, 16, 17]]
    items = [{"id": f"t{i}", "values": row, "label": LABELS[i % 3]} for i, row in enumerate(rows)]
    items[1]["target"] = "positive"
    items[2]["target"] = 0
    return items


@pytest.mark.slow  # about 12 s on 2 shared cores; test_an_adaptive_run_over_a_fixed_length_transformer is the fast one
def test_whole_and_sharded_token_runs_give_one_result(svc, imported):
    body = {"model": BAG, "inputs": _inputs(), "n_steps": 8, "top_k": 3, "precision": "fp32", "baseline": "mask",
            "compare_with": BAG_B, "faithfulness": True}
    ids = []
    for shard_size in (5, 2):
        r = svc.client.post("/attributions", json={**body, "shard_size": shard_size})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    for job_id in ids:
        job = svc.wait(job_id, timeout_s=300)
        assert job["status"] == "succeeded", (job.get("error"), svc.worker_logs()[-3000:])
    whole, sharded = (svc.client.get(f"/jobs/{j}/result").json() for j in ids)
    for result in (whole, sharded):
        AttributionResult.model_validate(result)
    assert sharded["shards"] == {"total": 3, "failed": []}

    def tolerance(where: str) -> tuple[float, float]:
        return (5e-2, 1e-4) if "relative_delta" in where or where.endswith("delta") else (1e-4, 1e-6)

    assert_same(*({k: v for k, v in r.items() if k not in ("shards", "artifacts")} for r in (sharded, whole)),
                tolerance, PER_RUN)
    by_id = {s["id"]: s for s in whole["samples"]}
    assert by_id["t1"]["words"] == ["acting", "plot", "but", "not", "funny"]
    assert by_id["t1"]["target"] == {"index": 2, "label": "positive", "source": "request"}
    assert by_id["t2"]["token_attributions"][-1] == 0.0 and by_id["t2"]["target"]["index"] == 0
    assert whole["summary"]["baseline"] == "mask" and whole["summary"]["views"] == ["text"]
    assert whole["faithfulness"]["n_samples"] == 5
    compared = {s["id"]: s for s in whole["comparison"]["samples"]}
    assert all(compared[i]["target"]["label"] == by_id[i]["target"]["label"] for i in by_id)

    from explainq_client import AttributionResult as SDKAttributionResult
    from explainq_client.render import attribution_html

    assert_renders(svc.settings, ids, SDKAttributionResult)
    frame = SDKAttributionResult(whole).to_pandas()
    assert len(frame) == sum(len(s["words"]) for s in whole["samples"])
    t1 = frame[frame["sample"] == "t1"]
    assert list(t1["name"]) == by_id["t1"]["words"] and list(t1["attribution"]) == by_id["t1"]["word_attributions"]
    assert "acting" in attribution_html(whole)
    page = svc.client.get(f"/ui/jobs/{ids[0]}")
    assert page.status_code == 200 and "funny" in page.text and "acting" in page.text


def test_an_adaptive_run_over_a_fixed_length_transformer(svc, imported):
    rows = [{"id": "a", "values": [CLS, 3, 4, 5, 6, 13, 7, 23]}, {"id": "b", "values": [CLS, 10, 11, 14, 16, 17, 0, 0]}]
    r = svc.client.post("/attributions", json={"model": TRANSFORMER, "inputs": rows, "n_steps": 128,
                                               "tolerance": 1e-3, "baseline": "pad"})
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], timeout_s=300)
    assert job["status"] == "succeeded", (job, svc.worker_logs()[-3000:])
    result = svc.client.get(f"/jobs/{r.json()['id']}/result").json()
    AttributionResult.model_validate(result)
    assert result["summary"]["tolerance_met"] is True and result["summary"]["baseline"] == "pad"
    assert all(abs(s["relative_delta"]) <= 1e-3 and s["token_attributions"][0] == 0.0 for s in result["samples"])
    assert result["samples"][1]["token_attributions"][-2:] == [0.0, 0.0]  # padding: no attribution, no word
    assert result["samples"][1]["words"] == ["acting", "very", "funny"]


ROW = [CLS, 3, 4]


@pytest.mark.parametrize(("body", "loc", "says"), [
    ({"model": BAG, "inputs": [{"id": "a", "values": [CLS, 3, 24, 4]}]}, ("body", "inputs", 0, "values", 2),
     "values[2] is 24, not a token id of the model's vocabulary (0..23)"),
    ({"model": BAG, "inputs": [{"id": "a", "values": ROW}, {"id": "b", "values": [CLS, -1]}]},
     ("body", "inputs", 1, "values", 1), "values[1] is -1"),
    ({"model": BAG, "inputs": [{"id": "a", "values": [CLS, 3.5]}]}, ("body", "inputs", 0, "values", 1),
     "must be a token id (an integer)"),
    ({"model": BAG, "inputs": [{"id": "a", "values": [3] * 33}]}, ("body", "inputs", 0, "values"),
     "reads 1 to 32"),
    ({"model": TRANSFORMER, "inputs": [{"id": "a", "values": ROW}]}, ("body", "inputs", 0, "values"),
     "reads exactly 8 (pad with its pad_id)"),
    ({"model": BAG, "texts": [{"id": "a", "text": "the movie"}]}, ("body", "texts"), "tokenized by the caller"),
    ({"model": BAG, "inputs": [{"id": "a", "values": ROW}], "baseline": "blur"}, ("body", "baseline"),
     "not for token inputs"),
    ({"model": NOMASK, "inputs": [{"id": "a", "values": ROW}], "baseline": "mask"}, ("body", "baseline"),
     "declares no mask_id"),
    ({"model": BAG, "inputs": [{"id": "a", "values": ROW}], "baseline": "mask", "compare_with": NOMASK},
     ("body", "baseline"), "model 'bag-nomask''s spec declares no mask_id"),
    ({"model": BAG, "inputs": [{"id": "a", "values": ROW}], "baseline_values": ROW}, ("body", "baseline_values"),
     "reads token ids"),
    ({"model": BAG, "inputs": [{"id": "a", "values": ROW}], "compare_with": TRANSFORMER}, ("body", "compare_with"),
     "same input spec"),
    ({"model": BAG, "inputs": [{"id": "a", "values": ROW, "target": "great"}]}, ("body", "inputs", 0, "target"),
     "not a class"),
])
def test_what_a_token_model_cannot_take_is_a_422_naming_the_field(svc, imported, body, loc, says):
    r = svc.client.post("/attributions", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert tuple(detail["loc"]) == loc and says in detail["msg"], detail
