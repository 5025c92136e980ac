"""A store that hangs or refuses never wedges a caller: every store call is bounded and retried with backoff, then
gives up as ``StoreUnavailable``; a job that meets it fails with ``store_unavailable`` (not ``internal``, never
``running`` for ever); the API answers 503 ``store_unavailable``; ``/ready`` and the metrics say the store is down.

The store is ``tests/faultstore.py``: a local directory seen as an object store whose calls hang or are refused
while a control file says so.
"""

from __future__ import annotations

import time

import pytest

from core import registry
from core.filestore import Store, StoreError, StoreUnavailable, store_options
from tests import faultstore
from tests.test_filestore import s3_server  # noqa: F401  (the fixture: moto's S3 server)
from tests.test_metrics import scrape, value

faultstore.register()


@pytest.fixture
def control(tmp_path, monkeypatch):
    path = tmp_path / "store-mode"
    monkeypatch.setenv(faultstore.CONTROL, str(path))
    faultstore.set_mode(path, "ok")
    yield path
    faultstore.set_mode(path, "ok")  # lets the calls left hanging in their threads end


@pytest.fixture
def store(tmp_path, control) -> Store:
    s = Store(f"faultfs://{tmp_path}/store", tmp_path / "cache", timeout_s=0.3, retries=2, backoff_s=0.05)
    s.put_bytes(b"x" * 3_000_000, "artifacts/j/big.bin")
    return s


@pytest.mark.parametrize("fault", ["hang", "refuse"])
@pytest.mark.parametrize("call", ["read_bytes", "exists", "list_files", "size", "local_dir", "put_bytes"])
def test_every_call_gives_up_after_its_retries(store, control, fault, call):
    faultstore.set_mode(control, fault)
    args = {"put_bytes": (b"y", "artifacts/j/new.bin")}.get(call, ("artifacts/j/big.bin",))
    if call == "local_dir":
        args = ("artifacts/j",)
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        getattr(store, call)(*args)
    took = time.monotonic() - t0
    # 3 attempts of at most 0.3 s (writes: plus a second per MiB) and 0.05 + 0.1 s of backoff
    assert took < 3 * (0.3 + 3) + 0.15 + 1.0, took
    assert caught.value.attempts == 3
    assert caught.value.cause == ("StoreTimeout" if fault == "hang" else "ConnectionRefusedError")
    assert "faultfs" not in str(caught.value) and str(store.root) not in str(caught.value)  # no address


def test_a_stalled_download_raises_instead_of_hanging(store, control):
    with store.open("artifacts/j/big.bin") as fh:
        assert len(fh.read(1 << 20)) == 1 << 20
        faultstore.set_mode(control, "hang")
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable):
            fh.read()
        assert time.monotonic() - t0 < 2
    faultstore.set_mode(control, "ok")
    assert sum(len(c) for c in store.iter_bytes("artifacts/j/big.bin")) == 3_000_000


def test_a_brief_outage_is_ridden_out(store, control, monkeypatch):
    """Refused twice, then back: the third attempt answers."""
    refusals = {"left": 2}
    fault = faultstore.fault

    def flaky():
        if refusals["left"]:
            refusals["left"] -= 1
            raise ConnectionRefusedError(111, "Connection refused")
        fault()

    monkeypatch.setattr(faultstore, "fault", flaky)
    assert store.read_bytes("artifacts/j/big.bin") == b"x" * 3_000_000
    assert refusals["left"] == 0


def test_the_stores_answers_are_not_retried(store, control):
    before = faultstore.CALLS["n"]
    with pytest.raises(StoreError, match="no 'artifacts/j/missing'"):
        store.read_bytes("artifacts/j/missing")
    assert faultstore.CALLS["n"] - before == 1  # one open, no retry


def test_check_says_why_without_an_address(store, control):
    assert store.check(1.0) is None
    faultstore.set_mode(control, "hang")
    t0 = time.monotonic()
    assert store.check(1.0) == "store timed out (0.3 s)"
    assert time.monotonic() - t0 < 1.0
    faultstore.set_mode(control, "refuse")
    assert store.check(1.0) == "store unreachable (ConnectionRefusedError)"


def test_object_stores_get_their_clients_own_timeouts():
    s3 = store_options("s3", 12.0, 2)["config_kwargs"]
    assert s3["connect_timeout"] == s3["read_timeout"] == 12.0 and s3["retries"]["max_attempts"] == 3
    assert store_options("gs", 12.0, 2) == {"requests_timeout": 12.0}
    assert store_options("file", 12.0, 2) == {} == store_options("memory", 12.0, 2)


@pytest.mark.parametrize(("variable", "value"), [("EXPLAINQ_STORE_TIMEOUT_S", "-1"),
                                                 ("EXPLAINQ_STORE_RETRIES", "-1"),
                                                 ("EXPLAINQ_STORE_RETRIES", "many")])
def test_bad_store_settings_are_refused_naming_the_variable(variable, value):
    from pydantic import ValidationError

    from core.settings import Settings

    with pytest.raises(ValidationError, match=variable):
        Settings(**{variable: value})


def test_a_job_fails_as_store_unavailable_and_the_service_says_the_store_is_down(tmp_path, control):
    from tests.service import Service

    env = {"EXPLAINQ_STORE": f"faultfs://{tmp_path}/store", "EXPLAINQ_STORE_TIMEOUT_S": "0.5",
           "EXPLAINQ_STORE_RETRIES": "1", faultstore.CONTROL: str(control),
           "EXPLAINQ_KIND_PLUGINS": "tests.jobkinds:register_test_kinds,tests.faultstore:register"}
    svc = Service(tmp_path, env=env, start=False)
    model_dir = tmp_path / "models" / "counter"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")  # an object store keeps files, not empty directories
    registry.register_model(svc.settings, "counter", kind="test", loader="tests.jobkinds:load_counter_model",
                            path=model_dir)
    with svc.start():
        c = svc.client
        done = c.post("/test/sleep", json={"steps": 1, "step_s": 0}).json()["id"]
        assert svc.wait(done)["status"] == "succeeded"
        ready = c.get("/ready")
        assert ready.status_code == 200 and ready.json()["store"] == "ok"
        assert value(scrape(c), "explainq_store_up") == 1

        for fault in ("hang", "refuse"):
            faultstore.set_mode(control, fault)
            t0 = time.monotonic()
            job = c.post("/test/sleep", json={"steps": 1, "step_s": 0, "model": "counter"}).json()["id"]
            body = svc.wait(job, timeout_s=30)
            assert time.monotonic() - t0 < 15
            assert body["status"] == "failed", body
            assert body["error"]["code"] == "store_unavailable", body["error"]
            assert "faultfs" not in body["error"]["message"] and str(tmp_path) not in body["error"]["message"]

            ready = c.get("/ready")
            assert ready.status_code == 503 and ready.json()["store"] == "unavailable", ready.json()
            samples = scrape(c)
            assert value(samples, "explainq_store_up") == 0
            outages = {dict(labels)["operation"]: n for (name, labels), n in samples.items()
                       if name == "explainq_store_unavailable_total"}
            assert sum(outages.values()) >= 1, outages  # counted by the worker that gave up
            listing = c.get(f"/jobs/{done}/artifacts")
            assert listing.status_code == 503, listing.text
            assert listing.json()["detail"]["code"] == "store_unavailable"
            assert listing.headers["Retry-After"]

        faultstore.set_mode(control, "ok")
        again = c.post("/test/sleep", json={"steps": 1, "step_s": 0, "model": "counter"}).json()["id"]
        body = svc.wait(again)
        assert body["status"] == "succeeded", (body, svc.worker_logs()[-3000:])
        assert c.get("/ready").json()["store"] == "ok"
        assert [f["name"] for f in c.get(f"/jobs/{again}/artifacts").json()["items"]] == ["out.txt"]


@pytest.mark.usefixtures("s3_server")
def test_a_real_s3_store_that_stops_or_hangs_fails_within_its_bounds(tmp_path):
    """s3fs against moto's S3 server: a server that went away (connections refused) and an endpoint that accepts
    connections and never answers (a paused server) both give StoreUnavailable within the store's bounds."""
    import socket

    import fsspec
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    bucket = f"explainq-outage-{time.time_ns()}"
    fsspec.filesystem("s3", endpoint_url=url).mkdir(bucket)
    store = Store(f"s3://{bucket}/store", tmp_path / "cache", timeout_s=1.0, retries=1, backoff_s=0.05,
                  endpoint_url=url)
    store.put_bytes(b"x" * 1000, "artifacts/j/a.bin")
    assert store.read_bytes("artifacts/j/a.bin") == b"x" * 1000 and store.check(1.0) is None
    server.stop()
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        store.read_bytes("artifacts/j/a.bin")
    assert time.monotonic() - t0 < 2 * (1.0 + 1) + 1, caught.value
    assert store.check(1.0) is not None

    paused = socket.create_server(("127.0.0.1", 0), backlog=64)  # accepts (in the kernel), never answers
    try:
        endpoint = f"http://127.0.0.1:{paused.getsockname()[1]}"
        hung = Store(f"s3://{bucket}/store", tmp_path / "cache2", timeout_s=1.0, retries=1, backoff_s=0.05,
                     endpoint_url=endpoint)
        for call, args in (("read_bytes", ("artifacts/j/a.bin",)), ("put_bytes", (b"y", "artifacts/j/b.bin")),
                           ("list_files", ("artifacts/j",))):
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable):
                getattr(hung, call)(*args)
            assert time.monotonic() - t0 < 2 * (1.0 + 1) + 1, call
        assert hung.check(1.0) is not None
    finally:
        paused.close()
