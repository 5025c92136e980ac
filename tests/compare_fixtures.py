"""Succeeded jobs with crafted results, for the comparison's tests (API, dashboard, SDK, browser): a test-sleep
job is submitted, taken off the queue and given the kind and result a worker would have left."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rq.job import Job
from rq.results import Result

from core.jobview import FiniteJSONSerializer
from tests.analysis_pages import attribution_result, tracin_result

ALICE, BOB = "compare-key-alice-0123456789", "compare-key-bob-0123456789"
KEYS = f"alice:{ALICE},bob:{BOB}"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def succeeded(http: Any, redis: Any, result: dict[str, Any] | None, kind: str, key: str = ALICE,
              steps: int = 1, artifacts: dict[str, str] | None = None, settings: Any = None) -> str:
    """A job of ``kind`` owned by ``key``'s owner that succeeded with ``result`` (None: left queued), with
    ``artifacts`` (name -> text) in the store. ``http``: a client of the app (TestClient or httpx)."""
    r = http.post("/test/sleep", json={"steps": steps, "step_s": 0}, headers=bearer(key))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    job = Job.fetch(job_id, connection=redis, serializer=FiniteJSONSerializer)
    job.meta.update({"kind": kind})
    job.save_meta()
    redis.lrem("rq:queue:explain", 0, job_id)
    if result is None:
        return job_id
    Result.create(job, Result.Type.SUCCESSFUL, ttl=600, return_value=result)
    redis.hset(job.key, mapping={"status": "finished", "started_at": "2026-01-01T12:00:00.000000Z",
                                 "ended_at": "2026-01-01T12:00:02.000000Z"})
    if artifacts:
        from core.artifacts import artifacts_key
        from core.filestore import get_store

        store = get_store(settings)
        for name, text in artifacts.items():
            store.put_bytes(text.encode(), artifacts_key(job_id, name))
    return job_id


def attribution_pair() -> tuple[dict[str, Any], dict[str, Any], str]:
    """Two attribution results of the same samples: a holds s1..s4 inline of 6 (s5, s6 in ``samples.jsonl``);
    under b, s1's word "SHOCKING" moves from 2.6 to 17.16 (+14.56), s2's score rises by 1, s4 is missing and s7
    is new. Returns (a, b, a's samples.jsonl)."""
    full = attribution_result(n=6)
    a = copy.deepcopy(full)
    a["samples"] = full["samples"][:4]
    a["listed"]["samples"] = {"total": 6, "inline": 4, "artifact": "samples.jsonl"}
    jsonl = "".join(json.dumps(s) + "\n" for s in full["samples"])
    b = copy.deepcopy(full)
    b["model"] = "nrms-b"
    s1 = b["samples"][0]
    s1["word_attributions"] = [17.16, *s1["word_attributions"][1:]]
    s1["score"] = s1["score"] + 14.56
    b["samples"][1]["score"] += 1.0
    seven = copy.deepcopy(b["samples"][5])
    seven["id"] = "s7"
    b["samples"] = [s for s in b["samples"] if s["id"] != "s4"] + [seven]
    b["listed"]["samples"] = {"total": 6, "inline": 6, "artifact": "samples.jsonl"}
    b["n_samples"] = 6
    return a, b, jsonl


def tracin_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """Two TracIn results: b (another estimator) swaps the first test triple's top two proponents, drops the
    third for a new one, and explains only the first test triple."""
    a = tracin_result()
    b = copy.deepcopy(a)
    b["estimator"] = "trak"
    first = b["results"][0]
    props = first["proponents"]
    first["proponents"] = [props[1], props[0], {"train_triple": ["india", "embassy", "uk"], "influence": 0.0101,
                                                 "train_self_influence": 0.01}]
    b["results"] = [first]
    b["n_test"] = 1
    b["listed"]["results"] = {"total": 1, "inline": 1, "artifact": "results.jsonl"}
    return a, b


def training_result(losses: list[float], mrr: list[float]) -> dict[str, Any]:
    from core.contract.results.training import TrainConvEResult

    metrics = {"mrr": mrr[-1], "mr": 3.0, "hits@1": 0.2, "hits@3": 0.4, "hits@10": 0.9, "n_queries": 10}
    return TrainConvEResult.model_validate({
        "model": "conve-x", "metrics": {"valid": metrics}, "parameters": 100, "checkpoints": [], "seconds": 1.0,
        "history": [{"epoch": i + 1, "loss": loss, "valid": {"mrr": m}} for i, (loss, m) in
                    enumerate(zip(losses, mrr, strict=True))],
        "steps": [{"step": i * 10, "epoch": i + 1.0, "loss": loss} for i, loss in enumerate(losses)],
    }).model_dump(mode="json", by_alias=True)


@contextmanager
def serve(home: Path) -> Iterator[tuple[Any, str, dict[str, str]]]:
    """The real app over HTTP (no workers) on a private Redis, with API keys ``KEYS`` and succeeded jobs of
    alice's: ``att_a``/``att_b`` (``attribution_pair``), ``tracin_a``/``tracin_b`` (``tracin_pair``),
    ``train_a``/``train_b`` (two ConvE runs), ``queued`` (a TracIn job still queued) and bob's ``bob_tracin``.
    Yields (settings, base URL, job ids by name)."""
    import httpx
    import redis as redis_lib

    from core.redis_server import EmbeddedRedis
    from core.settings import Settings
    from tests.http_server import HttpServer

    server = EmbeddedRedis(home / "redis", appendonly=False).start()
    try:
        settings = Settings(EXPLAINQ_HOME=str(home), REDIS_URL=server.url, EXPLAINQ_API_KEYS=KEYS)
        with HttpServer(settings) as http_server, httpx.Client(base_url=http_server.url) as http:
            r = redis_lib.Redis.from_url(server.url)
            att_a, att_b, jsonl = attribution_pair()
            tr_a, tr_b = tracin_pair()
            jobs = {
                "att_a": succeeded(http, r, att_a, "attributions", artifacts={"samples.jsonl": jsonl},
                                   settings=settings),
                "att_b": succeeded(http, r, att_b, "attributions"),
                "tracin_a": succeeded(http, r, tr_a, "tracin"), "tracin_b": succeeded(http, r, tr_b, "tracin"),
                "train_a": succeeded(http, r, training_result([0.9, 0.5], [0.3, 0.5]), "train_conve", steps=1),
                "train_b": succeeded(http, r, training_result([0.8, 0.4, 0.3], [0.35, 0.6, 0.65]), "train_conve",
                                     steps=2),
                "queued": succeeded(http, r, None, "tracin"),
                "bob_tracin": succeeded(http, r, tr_b, "tracin", key=BOB),
            }
            yield settings, http_server.url, jobs
    finally:
        server.stop()
