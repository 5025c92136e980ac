"""``GET /jobs/{id}/events``: every stream on one job in an API process shares one read of its view per interval,
so N streams cost one view, not N (a tenant's 16 streams no longer multiply the API's work)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from tests.compare_fixtures import ALICE, serve


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("shared-streams")) as s:
        yield s


def test_streams_on_one_job_share_its_reads(served, monkeypatch) -> None:
    from app.routers import jobs

    _, url, ids = served
    counts = {"reads": 0, "asks": 0}
    real_fetch, real_get = jobs._fetch_with_position, jobs.SharedViews.get

    async def fetch(request, job_id):
        counts["reads"] += 1
        return await real_fetch(request, job_id)

    async def get(self, key, max_age_s, read):
        counts["asks"] += 1
        return await real_get(self, key, max_age_s, read)

    monkeypatch.setattr(jobs, "_fetch_with_position", fetch)
    monkeypatch.setattr(jobs.SharedViews, "get", get)
    firsts: list[str] = []

    def watch() -> None:
        # the queued job's view does not change: after its first event a stream sends nothing for 15 s, so each
        # watcher stops at its read timeout, having kept its stream open (and polling) for 1.5 s
        timeout = httpx.Timeout(30.0, read=1.5)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ALICE}"}, timeout=timeout) as c, \
                c.stream("GET", f"/jobs/{ids['queued']}/events", params={"interval_s": 0.05}) as events:
            assert events.status_code == 200
            try:
                for line in events.iter_lines():
                    if line.startswith("data: "):
                        firsts.append(line)
            except httpx.ReadTimeout:
                return

    threads = [threading.Thread(target=watch) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(firsts) == 8 and all(ids["queued"] in f for f in firsts)  # each stream saw the view once
    assert counts["asks"] >= 8, counts
    assert counts["reads"] * 3 <= counts["asks"], counts  # not one read per stream and interval


def test_a_failed_read_is_not_served_to_the_next_stream() -> None:
    from app.routers.jobs import SharedViews

    views, calls = SharedViews(), []

    async def bad():
        calls.append("bad")
        raise RuntimeError("redis down")

    async def good():
        calls.append("good")
        return {"status": "queued"}

    async def go():
        with pytest.raises(RuntimeError):
            await views.get("k", 60.0, bad)
        assert await views.get("k", 60.0, good) == {"status": "queued"}  # read again at once, not the failure
        assert await views.get("k", 60.0, good) == {"status": "queued"}  # young: shared
        results = await asyncio.gather(*(views.get("other", 60.0, good) for _ in range(5)))
        assert results == [{"status": "queued"}] * 5

    asyncio.run(go())
    assert calls == ["bad", "good", "good"]
