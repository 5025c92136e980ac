"""Results kept as long as their owner wants: ``POST /jobs/{id}/keep`` exempts a finished job's record, result and
files from retention (``DELETE /jobs/{id}/keep`` undoes it); ``DELETE /jobs/{id}`` of a finished job deletes it
with its files (a running one is canceled, as before; ``cancel_only`` never deletes); another key's job is a 404
for each; the SDK and the job page's Keep button do the same. This service writes every result to the store
(``EXPLAINQ_RESULT_INLINE_BYTES=0``), Redis holding a pointer: the result shares its job's lifetime."""

from __future__ import annotations

import re
import time

import pytest
from rq.results import Result

from core import keys, results, retention
from core.artifacts import artifacts_key
from core.filestore import get_store
from core.keys import JOB_PREFIX

KEYS = "alice:keep-key-alice-0123456789,bob:keep-key-bob-0123456789"
ALICE_KEY, BOB_KEY = "keep-key-alice-0123456789", "keep-key-bob-0123456789"
ALICE = {"Authorization": f"Bearer {ALICE_KEY}"}
BOB = {"Authorization": f"Bearer {BOB_KEY}"}
TTL_S = 4  # the result TTL of this service: short, so a record's expiry is seen in the test


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from tests.service import Service

    with Service(tmp_path_factory.mktemp("keep"), api_keys=KEYS, heartbeat_ttl_s=20,
                 env={"EXPLAINQ_RESULT_TTL_S": str(TTL_S), "EXPLAINQ_FAILURE_TTL_S": str(TTL_S),
                      "EXPLAINQ_RESULT_INLINE_BYTES": "0"}) as s:
        yield s


def _done(svc, headers=ALICE, **body) -> str:
    r = svc.client.post("/test/sleep", json={"steps": 1, "step_s": 0, **body}, headers=headers)
    assert r.status_code == 202, r.text
    job = svc.wait(r.json()["id"], headers=headers)
    assert job["status"] in ("succeeded", "failed"), job
    return job["id"]


def _files(svc, job_id: str) -> bool:
    return get_store(svc.settings).exists(artifacts_key(job_id, "out.txt"))


def _stored_result(svc, job_id: str) -> bool:
    return get_store(svc.settings).exists(results.result_key(job_id))


def test_a_result_lives_in_the_store_and_redis_keeps_a_pointer(svc):
    job_id = _done(svc)
    from rq.job import Job

    from core.jobview import FiniteJSONSerializer

    held = Job.fetch(job_id, connection=svc.redis(), serializer=FiniteJSONSerializer).return_value(refresh=True)
    assert results.is_pointer(held) and held[results.POINTER]["bytes"] > 0
    assert _stored_result(svc, job_id)
    assert svc.client.get(f"/jobs/{job_id}/result", headers=ALICE).json()["steps"] == 1


def test_a_missing_or_changed_result_file_is_named_not_a_500(svc):
    job_id = _done(svc)
    store = get_store(svc.settings)
    store.put_bytes(b'{"steps": 2}', results.result_key(job_id))  # changed behind explainq's back
    r = svc.client.get(f"/jobs/{job_id}/result", headers=ALICE)
    assert r.status_code == 409 and r.json()["detail"]["code"] == "result_corrupt"
    store.delete(results.result_key(job_id))
    r = svc.client.get(f"/jobs/{job_id}/result", headers=ALICE)
    assert r.status_code == 404 and r.json()["detail"]["code"] == "result_missing"
    assert svc.client.get(f"/jobs/{job_id}", headers=ALICE).json()["status"] == "succeeded"


def test_a_kept_job_outlives_its_ttl_and_retention_leaves_its_files(svc):
    kept, other = _done(svc), _done(svc)
    r = svc.client.post(f"/jobs/{kept}/keep", headers=ALICE)
    assert r.status_code == 200 and r.json()["kept"] is True and r.json()["id"] == kept
    redis = svc.redis()
    assert redis.ttl(JOB_PREFIX + kept) == -1 and redis.ttl(Result.get_key(kept)) == -1
    assert redis.ttl(JOB_PREFIX + other) > 0
    deadline = time.monotonic() + TTL_S + 10
    while redis.exists(JOB_PREFIX + other) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not redis.exists(JOB_PREFIX + other)
    removed = retention.collect(svc.settings, grace_s=0)["artifacts"]
    assert other in removed and kept not in removed
    assert _files(svc, kept) and not _files(svc, other)
    assert _stored_result(svc, kept) and not _stored_result(svc, other)
    assert svc.client.get(f"/jobs/{kept}/result", headers=ALICE).json()["steps"] == 1
    assert svc.client.get(f"/jobs/{kept}/artifacts/out.txt", headers=ALICE).status_code == 200
    assert svc.client.get(f"/jobs/{kept}", headers=ALICE).json()["kept"] is True


def test_retention_skips_a_kept_job_even_without_its_record(svc):
    job_id = _done(svc)
    assert svc.client.post(f"/jobs/{job_id}/keep", headers=ALICE).status_code == 200
    svc.redis().delete(JOB_PREFIX + job_id)  # whatever removed it, the owner's keep decides
    assert job_id not in retention.collect(svc.settings, grace_s=0)["artifacts"] and _files(svc, job_id)


def test_undoing_a_keep_restores_the_retention_period(svc):
    job_id = _done(svc)
    svc.client.post(f"/jobs/{job_id}/keep", headers=ALICE)
    r = svc.client.delete(f"/jobs/{job_id}/keep", headers=ALICE)
    assert r.status_code == 200 and r.json()["kept"] is False
    redis = svc.redis()
    assert 0 < redis.ttl(JOB_PREFIX + job_id) <= TTL_S and 0 < redis.ttl(Result.get_key(job_id)) <= TTL_S
    assert not redis.hexists(keys.KEPT, job_id)


def test_only_a_finished_job_can_be_kept(svc):
    r = svc.client.post("/test/sleep", json={"steps": 200, "step_s": 0.05}, headers=ALICE)
    job_id = r.json()["id"]
    svc.wait(job_id, statuses=("running",), headers=ALICE)
    r = svc.client.post(f"/jobs/{job_id}/keep", headers=ALICE)
    assert r.status_code == 409 and r.json()["detail"]["code"] == "not_finished"
    assert svc.client.delete(f"/jobs/{job_id}", headers=ALICE).status_code == 202  # still a cancel
    assert svc.wait(job_id, headers=ALICE)["status"] == "canceled"


def test_deleting_a_finished_job_removes_its_record_and_files(svc):
    job_id = _done(svc)
    assert _files(svc, job_id) and _stored_result(svc, job_id)
    r = svc.client.delete(f"/jobs/{job_id}", headers=ALICE)
    assert r.status_code == 200, r.text
    assert r.json() == {"id": job_id, "deleted": True, "status": "succeeded", "files_removed": 1}
    assert not _files(svc, job_id) and not get_store(svc.settings).exists(artifacts_key(job_id))
    assert not _stored_result(svc, job_id)
    redis = svc.redis()
    assert not redis.exists(JOB_PREFIX + job_id) and not redis.exists(Result.get_key(job_id))
    assert not redis.hexists(keys.ARTIFACT_OWNERS, job_id)
    assert redis.zscore(keys.owner_jobs("alice"), job_id) is None
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/result", f"/jobs/{job_id}/artifacts"):
        assert svc.client.get(path, headers=ALICE).status_code == 404
    assert svc.client.delete(f"/jobs/{job_id}", headers=ALICE).status_code == 404


def test_a_failed_job_is_deleted_too(svc):
    job_id = _done(svc, steps=2, fail_at=0)
    r = svc.client.delete(f"/jobs/{job_id}", headers=ALICE)
    assert r.status_code == 200 and r.json()["status"] == "failed"


def test_cancel_only_never_deletes_and_a_kept_job_is_not_deleted(svc):
    job_id = _done(svc)
    r = svc.client.delete(f"/jobs/{job_id}", params={"cancel_only": "true"}, headers=ALICE)
    assert r.status_code == 409 and r.json()["detail"]["code"] == "already_finished"
    svc.client.post(f"/jobs/{job_id}/keep", headers=ALICE)
    r = svc.client.delete(f"/jobs/{job_id}", headers=ALICE)
    assert r.status_code == 409 and r.json()["detail"]["code"] == "kept" and _files(svc, job_id)
    svc.client.delete(f"/jobs/{job_id}/keep", headers=ALICE)
    assert svc.client.delete(f"/jobs/{job_id}", headers=ALICE).status_code == 200


@pytest.mark.parametrize(("method", "path"), [("POST", "/keep"), ("DELETE", "/keep"), ("DELETE", "")])
def test_another_keys_job_is_a_404_and_stays(svc, method, path):
    job_id = _done(svc)
    r = svc.client.request(method, f"/jobs/{job_id}{path}", headers=BOB)
    assert r.status_code == 404 and r.json()["detail"]["code"] == "not_found"
    assert svc.client.get(f"/jobs/{job_id}", headers=ALICE).json()["kept"] is False and _files(svc, job_id)


def test_the_sdk_keeps_and_deletes(svc):
    from explainq_client import Client, ConflictError

    from tests.http_server import HttpServer

    job_id = _done(svc)
    with HttpServer(svc.settings) as server, Client(server.url, ALICE_KEY) as client:
        job = client.jobs.get(job_id)
        assert job.kept is False and job.keep() is job and job.kept is True
        with pytest.raises(ConflictError) as refused:
            client.delete_job(job_id)
        assert refused.value.code == "kept"
        with pytest.raises(ConflictError) as finished:
            job.cancel()  # a cancel never deletes
        assert finished.value.code == "already_finished"
        assert job.unkeep().kept is False
        assert client.delete_job(job_id)["deleted"] is True
    assert not _files(svc, job_id)


def test_the_job_page_has_a_keep_button(svc):
    job_id = _done(svc)
    c = svc.client
    c.cookies.clear()
    try:
        assert c.post("/ui/login", data={"api_key": ALICE_KEY, "next": "/ui/jobs"},
                      follow_redirects=False).status_code == 303
        page = c.get(f"/ui/jobs/{job_id}").text
        assert 'id="keep"' in page and f'hx-post="/ui/jobs/{job_id}/keep"' in page
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
        r = c.post(f"/ui/jobs/{job_id}/keep", data={"csrf_token": csrf, "keep": "1"}, headers={"HX-Request": "true"})
        assert r.status_code == 200 and "Kept" in r.text and 'name="keep" value="0"' in r.text
        assert svc.client.get(f"/jobs/{job_id}", headers=ALICE).json()["kept"] is True
        r = c.post(f"/ui/jobs/{job_id}/keep", data={"csrf_token": csrf, "keep": "0"}, follow_redirects=False)
        assert r.status_code == 303 and svc.client.get(f"/jobs/{job_id}", headers=ALICE).json()["kept"] is False
    finally:
        c.cookies.clear()


def _log_records(svc, job_id: str) -> list[dict]:
    """The workers' JSON log records that name ``job_id``."""
    import json

    out = []
    for path in sorted(svc.home.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if job_id in line and line.startswith("{"):
                out.append(json.loads(line))
    return out


def test_a_cancel_is_logged_as_information_and_an_expected_failure_without_a_traceback(svc):
    r = svc.client.post("/test/sleep", json={"steps": 200, "step_s": 0.05}, headers=ALICE)
    canceled = r.json()["id"]
    svc.wait(canceled, statuses=("running",), headers=ALICE)
    assert svc.client.delete(f"/jobs/{canceled}", headers=ALICE).status_code == 202
    assert svc.wait(canceled, headers=ALICE)["status"] == "canceled"
    failed = _done(svc, steps=2, fail_at=0)

    def ended(job_id):
        return any(x.get("logger") != "rq.worker" or "exception" in x["message"] for x in _log_records(svc, job_id))

    deadline = time.monotonic() + 10
    while not (ended(canceled) and ended(failed)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for job_id in (canceled, failed):
        records = _log_records(svc, job_id)
        assert not [x for x in records if x["level"] in ("ERROR", "CRITICAL") or "Traceback" in x["message"]], records
    assert any(x["level"] == "INFO" and "canceled" in x["message"] for x in _log_records(svc, canceled))
    assert any(x["level"] == "WARNING" and "bad_step" in x["message"] for x in _log_records(svc, failed))
