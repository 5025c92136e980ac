"""``client.compare(a, b)`` (sync and async) and the dashboard's compare action and page, over HTTP on the real
app: the typed result and its tables, the errors the SDK raises, the jobs list's selection, and the page's values
as text for each renderer."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.compare_fixtures import ALICE, BOB, serve


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("compare-clients")) as s:
        yield s


def test_the_sdk_compares_two_jobs_and_gives_its_tables_as_data_frames(served) -> None:
    from explainq_client import Client, ComparisonResult

    _, url, jobs = served
    with Client(url, ALICE) as c:
        cmp = c.compare(jobs["att_a"], c.jobs.get(jobs["att_b"]))
        assert isinstance(cmp, ComparisonResult) and cmp.renderer == "attributions"
        samples = cmp.to_pandas()
        assert list(samples["id"]) == ["s1", "s2", "s3", "s5", "s6"]
        assert samples.set_index("id").loc["s1", "score_delta"] == pytest.approx(14.56)
        words = cmp.to_pandas("words")
        assert words.iloc[0]["word"] == "shocking" and words.iloc[0]["delta"] == pytest.approx(14.56)
        assert len(cmp.to_pandas("sample_words")) == sum(len(s["words"]) for s in cmp.section["samples"])
        assert "SHOCKING +14.56" in cmp.text() and "<table" in cmp._repr_html_()
        tracin = c.compare(jobs["tracin_a"], jobs["tracin_b"])
        lists = tracin.to_pandas("lists")
        assert list(lists["role"]) == ["proponents", "opponents"] and list(lists["overlap"]) == [2, 2]
        triples = tracin.to_pandas()
        assert set(triples["change"]) == {"stayed", "entered", "left"}
        train = c.compare(jobs["train_a"], jobs["train_b"])
        history = train.to_pandas("history")
        assert list(history["run"]) == ["a", "a", "b", "b", "b"]
        assert "valid_mrr" in train.text()
        with pytest.raises(ValueError, match="of must be one of"):
            train.rows("words")


def test_the_sdk_raises_typed_errors_for_jobs_it_cannot_compare(served) -> None:
    from explainq_client import Client, ConflictError, NotFoundError, ValidationError

    _, url, jobs = served
    with Client(url, ALICE, max_retries=0) as c:
        with pytest.raises(NotFoundError):
            c.compare(jobs["tracin_a"], jobs["bob_tracin"])
        with pytest.raises(ConflictError):
            c.compare(jobs["tracin_a"], jobs["queued"])
        with pytest.raises(ValidationError):
            c.compare(jobs["tracin_a"], jobs["att_a"])


def test_the_async_sdk_compares_too(served) -> None:
    from explainq_client import AsyncClient, ComparisonResult

    _, url, jobs = served

    async def go():
        async with AsyncClient(url, ALICE) as c:
            return await c.compare(jobs["tracin_a"][:10], jobs["tracin_b"])

    cmp = asyncio.run(go())
    assert isinstance(cmp, ComparisonResult) and cmp.section["matched"] == 1


@contextmanager
def _signed_in(url: str, key: str = ALICE) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url) as c:
        r = c.post("/ui/login", data={"api_key": key, "next": "/ui/jobs"}, follow_redirects=False)
        assert r.status_code == 303, r.text
        yield c


def test_the_jobs_list_offers_succeeded_jobs_for_comparison(served) -> None:
    _, url, jobs = served
    with _signed_in(url) as c:
        page = c.get("/ui/jobs").text
    assert '<form id="compare-form" method="get" action="/ui/compare"' in page
    boxes = re.findall(r'<input type="checkbox" name="ids" value="([0-9a-f]+)" form="compare-form"', page)
    assert set(boxes) == {v for k, v in jobs.items() if k not in ("queued", "bob_tracin")}


def test_the_compare_page_shows_each_renderers_values_as_text(served) -> None:
    _, url, jobs = served
    with _signed_in(url) as c:
        att = c.get("/ui/compare", params=[("ids", jobs["att_a"]), ("ids", jobs["att_b"])])
        assert att.status_code == 200, att.text
        assert "SHOCKING" in att.text and "+14.56" in att.text and "s7" in att.text
        tr = c.get("/ui/compare", params={"a": jobs["tracin_a"], "b": jobs["tracin_b"]})
        assert tr.status_code == 200 and "entered" in tr.text and "india · embassy · uk" in tr.text
        train = c.get("/ui/compare", params={"a": jobs["train_a"], "b": jobs["train_b"]})
        assert train.status_code == 200 and "valid_mrr" in train.text and "data-overlay=" in train.text
        one = c.get("/ui/compare", params={"ids": jobs["att_a"]})
        assert one.status_code == 422 and "choose two jobs" in one.text
        other = c.get("/ui/compare", params={"a": jobs["tracin_a"], "b": jobs["bob_tracin"]})
        assert other.status_code == 404
    with _signed_in(url, BOB) as c:
        assert c.get("/ui/compare", params={"a": jobs["tracin_a"], "b": jobs["bob_tracin"]}).status_code == 404
