"""Artifact downloads by pre-signed URL where the store signs them (S3: moto's server, through s3fs), streamed by
the API otherwise (a local directory store, ``redirect=false``, ``EXPLAINQ_PRESIGNED_URL_TTL_S=0``), and the SDK
following the redirect without sending its API key to the store."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import fsspec
import httpx
import pytest

from core.artifacts import artifacts_key, record_owner
from core.filestore import Store, get_store
from tests.service import api_client
from tests.test_filestore import s3_server  # noqa: F401  (the fixture: moto's S3 server)

BLOB = b"a,b\n" + b"1,2\n" * 50_000
JOB = "0123456789abcdef0123456789abcdef"
KEYS = "alice:key-alice,bob:key-bob"
ALICE = {"Authorization": "Bearer key-alice"}


@pytest.fixture
def bucket(s3_server):  # noqa: F811  (the imported fixture)
    name = f"explainq-sign-{uuid.uuid4().hex[:12]}"
    fs = fsspec.filesystem("s3")
    fs.mkdir(name)
    yield f"s3://{name}/store"
    fs.rm(name, recursive=True)


def test_an_s3_store_signs_a_url_anyone_can_get_and_a_file_system_store_signs_none(bucket, tmp_path):
    store = Store(bucket, tmp_path / "cache")
    store.put_bytes(BLOB, "artifacts/j/scores.csv")
    url = store.sign("artifacts/j/scores.csv", 60, "scores.csv")
    assert url and url.startswith("http://127.0.0.1:") and "Signature" in url
    r = httpx.get(url)  # no credentials: the signature is the permission
    assert r.status_code == 200 and r.content == BLOB
    assert r.headers["content-disposition"] == 'attachment; filename="scores.csv"'
    assert r.headers["content-type"].startswith("text/csv")
    tampered = url.replace("scores.csv", "other.csv", 1)
    assert httpx.get(tampered).status_code == 403
    assert store.sign("artifacts/j/scores.csv", 0) is None  # turned off
    local = Store(str(tmp_path / "store"), tmp_path / "cache2")
    local.put_bytes(BLOB, "artifacts/j/scores.csv")
    assert local.sign("artifacts/j/scores.csv", 60) is None
    memory = Store(f"memory://sign-{uuid.uuid4().hex}", tmp_path / "cache3")
    memory.put_bytes(b"x", "artifacts/j/x.bin")
    assert memory.sign("artifacts/j/x.bin", 60) is None


def _job_files(settings, name: str = "scores.csv") -> None:
    record_owner(settings, JOB, "alice", "test")
    get_store(settings).put_bytes(BLOB, artifacts_key(JOB, name))


def test_the_api_redirects_an_s3_download_to_its_signed_url_and_checks_the_owner_first(bucket, tmp_path):
    with api_client(tmp_path, EXPLAINQ_STORE=bucket, EXPLAINQ_API_KEYS=KEYS) as c:
        _job_files(c.app.state.settings)
        r = c.get(f"/jobs/{JOB}/artifacts/scores.csv", headers=ALICE, follow_redirects=False)
        assert r.status_code == 307, r.text
        assert r.headers["cache-control"] == "no-store"
        query = dict(httpx.URL(r.headers["location"]).params)
        expires = int(query["Expires"]) - time.time() if "Expires" in query else int(query["X-Amz-Expires"])
        assert 240 < expires <= 301, query  # EXPLAINQ_PRESIGNED_URL_TTL_S
        fetched = httpx.get(r.headers["location"])
        assert fetched.status_code == 200 and fetched.content == BLOB
        # someone else's, a missing file, a directory: no URL is signed
        other = c.get(f"/jobs/{JOB}/artifacts/scores.csv", headers={"Authorization": "Bearer key-bob"},
                      follow_redirects=False)
        assert other.status_code == 404 and "location" not in other.headers
        assert c.get(f"/jobs/{JOB}/artifacts/nope.csv", headers=ALICE, follow_redirects=False).status_code == 404
        # redirect=false streams through the API
        streamed = c.get(f"/jobs/{JOB}/artifacts/scores.csv?redirect=false", headers=ALICE)
        assert streamed.status_code == 200 and streamed.content == BLOB
        assert streamed.headers["content-length"] == str(len(BLOB))


def test_the_api_streams_where_signing_is_off_or_the_store_signs_nothing(bucket, tmp_path):
    with api_client(tmp_path / "off", EXPLAINQ_STORE=bucket, EXPLAINQ_API_KEYS=KEYS,
                    EXPLAINQ_PRESIGNED_URL_TTL_S="0") as c:
        _job_files(c.app.state.settings)
        r = c.get(f"/jobs/{JOB}/artifacts/scores.csv", headers=ALICE, follow_redirects=False)
        assert r.status_code == 200 and r.content == BLOB
    with api_client(tmp_path / "local", EXPLAINQ_API_KEYS=KEYS) as c:  # the default store: a local directory
        _job_files(c.app.state.settings)
        r = c.get(f"/jobs/{JOB}/artifacts/scores.csv", headers=ALICE, follow_redirects=False)
        assert r.status_code == 200 and r.content == BLOB
        assert r.headers["content-disposition"] == 'attachment; filename="scores.csv"'


def test_the_sdk_follows_the_redirect_without_sending_its_key_to_the_store(tmp_path: Path):
    from explainq_client import Client

    seen: list[httpx.Request] = []
    store_url = "https://store.example.com/bucket/artifacts/j/scores.csv?X-Amz-Signature=abc"

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.host == "store.example.com":
            return httpx.Response(200, content=BLOB)
        if request.url.path.endswith("/artifacts"):
            return httpx.Response(200, json={"items": [{"name": "scores.csv", "size": len(BLOB),
                                                        "media_type": "text/csv",
                                                        "url": f"/jobs/{JOB}/artifacts/scores.csv"}]})
        if request.url.path == f"/jobs/{JOB}":
            return httpx.Response(200, json={"id": JOB, "kind": "test", "status": "succeeded"})
        return httpx.Response(307, headers={"Location": store_url})

    client = Client("http://api.example.com", "key-alice", transport=httpx.MockTransport(handler))
    paths = client.jobs.get(JOB).download(tmp_path)
    assert [p.read_bytes() for p in paths] == [BLOB]
    to_store = [r for r in seen if r.url.host == "store.example.com"]
    assert len(to_store) == 1 and "authorization" not in to_store[0].headers
    assert all(r.headers.get("authorization") == "Bearer key-alice" for r in seen if r.url.host == "api.example.com")
