"""``GET /jobs/{id}/result``: served as stored, declared with every kind's result model, and marked when a stored
result does not match its kind's model (one an earlier version wrote)."""

from __future__ import annotations

import pytest
from rq.job import Job
from rq.results import Result

from core.contract.results.influence import InfluenceResult
from core.jobview import FiniteJSONSerializer
from tests.result_examples import example
from tests.service import api_client

# what a fanned-out TracIn job of an earlier version returned: its results in an artifact, not a list
OLD_SHARDED = {"model": "conve-nations-demo", "mode": "test", "top_k": 10, "n_candidates_scored": 1592,
               "results": {"artifact": "results.jsonl", "count": 3}, "top_proponents": [], "top_opponents": [],
               "artifacts": []}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with api_client(tmp_path_factory.mktemp("result-route")) as c:
        yield c


def _succeeded(client, result: dict, kind: str = "tracin", schema: str | None = None) -> str:
    """A job of ``kind`` (owned by the caller) that succeeded with ``result``, as a worker leaves it."""
    job_id = client.post("/test/sleep", json={"steps": 1, "step_s": 0}).json()["id"]
    redis = client.app.state.redis
    job = Job.fetch(job_id, connection=redis, serializer=FiniteJSONSerializer)
    job.meta.update({"kind": kind, **({"result_schema": schema} if schema else {})})
    job.save_meta()
    redis.lrem("rq:queue:explain", 0, job_id)
    Result.create(job, Result.Type.SUCCESSFUL, ttl=600, return_value=result)
    redis.hset(job.key, "status", "finished")
    return job_id


def test_the_result_route_documents_every_kinds_result_model(client) -> None:
    spec = client.get("/openapi.json").json()
    answer = spec["paths"]["/jobs/{job_id}/result"]["get"]["responses"]["200"]["content"]["application/json"]
    named = {ref["$ref"].rsplit("/", 1)[-1] for ref in answer["schema"]["anyOf"]}
    assert {"InfluenceResult", "AttributionResult", "LdsResult", "MislabelResult", "TrainConvEResult",
            "TrainBDHResult", "TrainNewsResult", "AblationResult", "FeaturizeResult", "ImportResult"} <= named
    assert all(name in spec["components"]["schemas"] for name in named)
    kinds = {k["name"]: k for k in client.get("/kinds").json()["kinds"]}
    assert kinds["tracin"]["result"] == "InfluenceResult" and kinds["evaluate_attribution"]["result"] == "LdsResult"


def test_a_result_the_worker_validated_is_served_as_stored(client) -> None:
    result = InfluenceResult.model_validate(example(InfluenceResult)).model_dump(mode="json")
    job_id = _succeeded(client, result, schema="InfluenceResult")
    r = client.get(f"/jobs/{job_id}/result")
    assert r.status_code == 200 and r.json() == result
    assert r.headers["x-explainq-result-schema"] == "InfluenceResult"


def test_a_stored_result_without_a_schema_record_is_validated_when_read(client) -> None:
    result = InfluenceResult.model_validate(example(InfluenceResult)).model_dump(mode="json")
    r = client.get(f"/jobs/{_succeeded(client, result)}/result")
    assert r.json() == result and r.headers["x-explainq-result-schema"] == "InfluenceResult"


def test_an_earlier_versions_result_that_does_not_match_is_served_as_stored_and_marked(client) -> None:
    r = client.get(f"/jobs/{_succeeded(client, OLD_SHARDED)}/result")
    assert r.status_code == 200 and r.json() == OLD_SHARDED
    assert r.headers["x-explainq-result-schema"] == "unvalidated"


def test_a_kind_without_a_result_model_serves_free_json(client) -> None:
    job_id = _succeeded(client, {"anything": [1, 2]}, kind="test_sleep")
    r = client.get(f"/jobs/{job_id}/result")
    assert r.json() == {"anything": [1, 2]} and r.headers["x-explainq-result-schema"] == "none"
