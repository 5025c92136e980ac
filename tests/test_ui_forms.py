"""The new-job forms as people read them (over HTTP, no browser): labels and help from the schemas, expert fields
under "Advanced", rows of samples and triples, the vocabulary the triple rows complete from, clone-and-edit
(only of the caller's own jobs), and one name per kind."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from core.contract.kind import load_kinds as load_all
from tests.formserver import ALICE, BOB, CONVE, ENTITIES, NEWS, RELATIONS, api, serve

PRODUCT_KINDS = ("attributions", "tracin", "train_bdh", "train_conve", "train_news", "import_model", "ablations")
EXPERT = {"attributions": ("shard_size", "alpha_batch_size", "batch_size", "max_failed_fraction", "shard_retries",
                           "precision", "method", "tolerance"),
          "tracin": ("shard_size", "max_failed_fraction", "batch_size", "projection_dim", "method"),
          "train_bdh": ("grad_accum_steps", "warmup_steps", "compile", "num_workers"),
          "train_conve": ("label_smoothing", "input_dropout", "checkpoint_every")}
ESSENTIAL = {"attributions": ("model", "n_steps", "compare_with"), "tracin": ("model", "mode", "top_k"),
             "train_bdh": ("dataset", "epochs", "lr"), "train_conve": ("name", "dataset", "epochs", "lr")}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("forms")) as answer:
        yield answer


@pytest.fixture(scope="module")
def server(served) -> str:
    return served[1]


@contextmanager
def _browser(url: str, key: str) -> Iterator[httpx.Client]:
    """A client signed in to the dashboard as ``key``'s owner (its session cookie)."""
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.post("/ui/login", data={"api_key": key, "next": "/ui/jobs"})
        assert r.status_code == 303, r.text
        yield c


def _token(page: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def _advanced_part(page: str) -> tuple[str, str]:
    """(the form before the Advanced fold, the fold)."""
    form = page[page.index('<form class="job-form"'):]
    if '<details class="advanced"' not in form:
        return form, ""
    head, _, fold = form.partition('<details class="advanced"')
    return head, fold[:fold.index("</details>")]


@pytest.mark.parametrize("kind", sorted(EXPERT))
def test_expert_fields_are_in_the_advanced_fold_closed_by_default(server, kind) -> None:
    with _browser(server, ALICE) as c:
        page = c.get(f"/ui/new/{kind}").text
    head, fold = _advanced_part(page)
    assert re.match(r'\s+id="advanced"\s*>', fold), fold[:80]  # no "open" attribute
    for name in EXPERT[kind]:
        assert f'name="{name}"' in fold and f'name="{name}"' not in head, name
    for name in ESSENTIAL[kind]:
        assert f'name="{name}"' in head and f'name="{name}"' not in fold, name
    # the job's label and tags come after the essentials, before the fold
    assert head.index('name="label"') > head.index(f'name="{ESSENTIAL[kind][-1]}"')
    assert 'name="tags"' in head


def _identifier_titles(name: str) -> set[str]:
    words = name.replace("_", " ")
    return {words.title(), words.capitalize(), name, words}


@pytest.mark.parametrize("kind", sorted(k.name for k in load_all().values()
                                          if not k.internal and k.func.startswith("workers.jobs.")))
def test_every_label_is_written_for_people(server, kind) -> None:
    """No label is the field's identifier (title-cased or not), every field has help, no help speaks HTTP."""
    with _browser(server, ALICE) as c:
        page = c.get(f"/ui/new/{kind}").text
    labels = re.findall(r'<label for="f-([^"]+)">([^<*]+)', page)
    labels += [(n, t) for n, t in re.findall(r'<input type="checkbox" id="f-([^"]+)"[^>]*> ([^<]+)</label>', page)]
    legends = re.findall(r'<fieldset class="group[^"]*" id="f-([^"]+)"[^>]*>\s*<legend>([^<]+)</legend>', page)
    assert labels, page
    for dom_id, text in labels + legends:
        name = re.sub(r"-\d+$", "", dom_id).rsplit("-", 1)[-1]
        text = html.unescape(text).strip()
        assert text not in _identifier_titles(name), (kind, dom_id, text)
    assert not re.search(r"\b409\b", page) and "another owner" not in page
    # every field of the kind has a title and help of its own in the schema the form is built from
    request = load_all()[kind].request
    for name, info in request.model_fields.items():
        assert info.title and info.title not in _identifier_titles(name), (kind, name)
        assert info.description, (kind, name)


def test_kinds_have_one_name_everywhere(server) -> None:
    with _browser(server, ALICE) as c:
        index = c.get("/ui/new").text
        assert 'href="/ui/new/import_model"' in index and "models_import" not in index
        listed = set(re.findall(r'href="/ui/new/([^"]+)"', index))
        assert listed == {k.name for k in load_all().values() if not k.internal}, listed
        assert ">Import a model<" in index
        page = c.get("/ui/new/import_model").text
        assert "New job: Import a model" in page and "models_import" not in page
        assert c.get("/ui/new/models_import").status_code == 404


def _post(c: httpx.Client, kind: str, data: list[tuple[str, str]]) -> httpx.Response:
    """Post the form as a browser would: repeated names (rows) in order."""
    fields: dict[str, list[str]] = {"csrf_token": [_token(c.get(f"/ui/new/{kind}").text)]}
    for name, value in data:
        fields.setdefault(name, []).append(value)
    return c.post(f"/ui/new/{kind}", data=fields)


def test_several_samples_submit_as_one_request(server) -> None:
    with _browser(server, ALICE) as c, api(server) as a:
        r = _post(c, "attributions", [
            ("model", NEWS), ("n_steps", "8"), ("label", "two users"), ("tags", "multi, ui"),
            ("sample.id", "first"), ("sample.candidate", "Lakers win"), ("sample.history", "a\nb"),
            ("sample.label", ""), ("sample.candidate_body", ""),
            ("sample.id", ""), ("sample.candidate", "Markets fall"), ("sample.history", "c"),
            ("sample.label", "fake"), ("sample.candidate_body", ""),
            ("sample.id", ""), ("sample.candidate", ""), ("sample.history", ""),  # an empty row: left out
            ("sample.label", ""), ("sample.candidate_body", "")])
        assert r.status_code == 303, r.text
        job_id = r.headers["location"].rsplit("/", 1)[1]
        body = a.get(f"/jobs/{job_id}/request").json()
        assert body["samples"] == [
            {"id": "first", "candidate": "Lakers win", "history": ["a", "b"], "label": None, "candidate_body": None,
             "history_bodies": None},
            {"id": "s2", "candidate": "Markets fall", "history": ["c"], "label": "fake", "candidate_body": None,
             "history_bodies": None}]
        assert body["label"] == "two users" and body["tags"] == ["multi", "ui"]
        view = a.get(f"/jobs/{job_id}").json()
        assert view["model"] == NEWS and view["input"] == "2 samples: “Lakers win”"


def test_a_bad_sample_row_is_named_by_its_number_and_every_row_is_kept(server) -> None:
    with _browser(server, ALICE) as c:
        r = _post(c, "attributions", [
            ("model", NEWS), ("sample.id", "a"), ("sample.candidate", "ok"), ("sample.history", "h"),
            ("sample.label", ""), ("sample.candidate_body", ""),
            ("sample.id", "b"), ("sample.candidate", "no history"), ("sample.history", ""),
            ("sample.label", ""), ("sample.candidate_body", "")])
    assert r.status_code == 422
    assert re.search(r'id="f-sample-history-err" role="alert">sample 2: ', r.text), r.text
    assert r.text.count('name="sample.candidate"') == 2 + 1  # both rows, and the template of a new one
    assert 'value="no history"' in r.text


def _triples(*rows: tuple[str, str, str], name: str = "test_triples") -> list[tuple[str, str]]:
    return [(f"{name}.{part}", value) for row in rows for part, value in zip(("head", "relation", "tail"), row,
                                                                              strict=True)]


def test_triple_rows_submit_as_triples(server) -> None:
    with _browser(server, ALICE) as c, api(server) as a:
        r = _post(c, "tracin", [("model", CONVE), ("mode", "test"),
                                *_triples(("usa", "embassy", "uk"), ("", "", ""), ("uk", "treaties", "burma"))])
        assert r.status_code == 303, r.text
        job_id = r.headers["location"].rsplit("/", 1)[1]
        assert a.get(f"/jobs/{job_id}/request").json()["test_triples"] == [
            ["usa", "embassy", "uk"], ["uk", "treaties", "burma"]]
        r = _post(c, "tracin", [("model", CONVE), *_triples(("usa", "embassy", "uk"), ("uk", "nope", "usa"))])
    assert r.status_code == 422
    assert re.search(r'id="f-test_triples-err" role="alert">triple 2, relation: unknown relation', r.text), r.text
    assert 'value="nope"' in r.text


def test_vocabulary_route_is_bounded_filtered_and_needs_a_key(server) -> None:
    with api(server) as a:
        r = a.get(f"/models/{CONVE}/vocabulary", params={"field": "entities"})
        assert r.status_code == 200 and r.json()["names"] == sorted(ENTITIES) and r.json()["total"] == len(ENTITIES)
        r = a.get(f"/models/{CONVE}/vocabulary", params={"field": "entities", "q": "U", "limit": 2})
        assert r.json() == {"model": CONVE, "field": "entities", "total": len(ENTITIES), "matched": len(ENTITIES),
                            "names": ["uk", "usa"]}  # names starting with it come first
        assert a.get(f"/models/{CONVE}/vocabulary", params={"field": "relations"}).json()["names"] == sorted(
            RELATIONS)
        for params, loc in (({"field": "entities", "limit": 1001}, ["query", "limit"]),
                            ({"field": "checkpoints"}, ["query", "field"]),
                            ({"field": "entities", "q": "x" * 513}, ["query", "q"])):
            r = a.get(f"/models/{CONVE}/vocabulary", params=params)
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, r.text
        r = a.get(f"/models/{NEWS}/vocabulary", params={"field": "entities"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "name"]
        assert a.get("/models/nope/vocabulary", params={"field": "entities"}).status_code == 404
    assert httpx.get(f"{server}/models/{CONVE}/vocabulary", params={"field": "entities"}).status_code == 401


def test_the_form_lists_the_models_vocabulary(server) -> None:
    with _browser(server, ALICE) as c:
        page = c.get("/ui/new/tracin").text
        assert 'hx-get="/ui/vocabulary"' in page and 'list="vocab-entities"' in page
        lists = c.get("/ui/vocabulary", params={"model": CONVE}).text
        assert re.findall(r'<datalist id="vocab-entities">(.*?)</datalist>', lists, re.S)[0].count("<option") == len(
            ENTITIES)
        assert '<option value="embassy">' in lists
        empty = c.get("/ui/vocabulary", params={"model": "nope"}).text
        assert "<option" not in empty


def test_clone_prefills_the_form_with_the_callers_own_request_only(server) -> None:
    with api(server) as a:
        job = a.post("/attributions", json={
            "model": NEWS, "n_steps": 12, "label": "secret headline study", "tags": ["clone-me"],
            "samples": [{"id": "x", "candidate": "Unique Clone Headline", "history": ["h1", "h2"]},
                        {"id": "y", "candidate": "Second Clone Headline", "history": ["h3"]}],
            "dataset": None, "shard_size": 7}).json()
        other = a.post("/test/sleep", json={"steps": 1}).json()
    with _browser(server, ALICE) as c:
        job_page = c.get(f"/ui/jobs/{job['id']}").text
        assert f'href="/ui/new/attributions?clone={job["id"]}"' in job_page
        page = c.get(f"/ui/new/attributions?clone={job['id'][:10]}").text
        assert 'value="Unique Clone Headline"' in page and 'value="Second Clone Headline"' in page
        assert ">h1\nh2</textarea>" in page and 'name="n_steps" type="number" value="12"' in page
        assert 'name="label" type="text" value="secret headline study"' in page
        assert 'name="tags" type="text" value="clone-me"' in page
        assert 'name="shard_size" type="text" class="mono" value="7"' in page
        assert f"A copy of job {job['id'][:8]}" in page
        r = c.get(f"/ui/new/train_bdh?clone={job['id']}")  # the form of another kind
        assert r.status_code == 404 and "Unique Clone" not in r.text
        assert c.get(f"/ui/new/attributions?clone={other['id']}").status_code == 404
    with _browser(server, BOB) as c:
        r = c.get(f"/ui/new/attributions?clone={job['id']}")
        assert r.status_code == 404
        assert "Unique Clone" not in r.text and "secret headline" not in r.text and "clone-me" not in r.text


def test_a_training_runs_cost_is_estimated_from_the_formula_and_the_callers_last_run(served) -> None:
    import redis

    from core.keys import JOB_PREFIX

    settings, server = served
    with api(server) as a, api(server, BOB) as b:
        first = a.post("/kinds/train_bdh/estimate", json={"epochs": 3, "val_fraction": 0.1}).json()
        # digits: 1,797 images less the fixed 20 % test split, less the 10 % validation share
        assert (first["unit"], first["per_epoch"], first["examples"], first["steps"]) == (
            "images", 1294, 3 * 1294, 3 * 21)
        assert first["estimate"] is True and first["seconds"] is None and first["rate"] is None
        conve = a.post("/kinds/train_conve/estimate", json={"name": "m", "epochs": 2, "batch_size": 100}).json()
        assert (conve["per_epoch"], conve["steps"]) == (2 * 1592, 2 * 32)  # nations, with reciprocal triples
        # a run of 3 epochs that took a minute measures the rate: 6 epochs take two minutes
        job = a.post("/train/bdh", json={"epochs": 3, "label": "measured"}).json()
        redis.Redis.from_url(settings.redis_url).hset(JOB_PREFIX + job["id"], mapping={
            "status": "finished", "started_at": "2026-01-01T00:00:00.000000Z",
            "ended_at": "2026-01-01T00:01:00.000000Z"})
        timed = a.post("/kinds/train_bdh/estimate", json={"epochs": 6}).json()
        assert timed["rate"]["job_id"] == job["id"] and timed["rate"]["seconds"] == 60
        assert timed["seconds"] == pytest.approx(120)
        assert b.post("/kinds/train_bdh/estimate", json={"epochs": 6}).json()["rate"] is None  # not bob's run
        bad = a.post("/kinds/train_bdh/estimate", json={"epochs": 0})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "epochs"]
        assert a.post("/kinds/tracin/estimate", json={}).status_code == 404
    with _browser(server, ALICE) as c:
        page = c.get("/ui/new/train_bdh").text
        assert 'hx-post="/ui/new/train_bdh/estimate"' in page
        shown = c.post("/ui/new/train_bdh/estimate", data={"csrf_token": _token(page), "epochs": "6"}).text
        assert "Estimate:" in shown and "1,294 training images" in shown and "2 min 00 s" in shown
        assert "An estimate" in shown and job["id"][:8] in shown
        assert "/estimate" not in c.get("/ui/new/attributions").text


def test_the_jobs_list_shows_model_input_label_and_tags_and_searches_them(server) -> None:
    with api(server) as a:
        one = a.post("/attributions", json={"model": NEWS, "label": "findable study", "tags": ["list-x"],
                                            "samples": [{"id": "a", "candidate": "Storm hits coast",
                                                         "history": ["h"]}]}).json()
        two = a.post("/tracin", json={"model": CONVE, "test_triples": [["usa", "embassy", "uk"]]}).json()
    with _browser(server, ALICE) as c:
        page = c.get("/ui/jobs").text
        row = page[page.index(f'id="row-{one["id"]}"'):]
        row = row[:row.index("</tr>")]
        assert f'<td class="c-model mono" data-label="Model">{NEWS}</td>' in row and "1 sample: “Storm hits coast”" in row
        assert '<div class="job-label">findable study</div>' in row and 'href="/ui/jobs?tag=list-x"' in row
        assert "1 triple: usa · embassy · uk" in page
        found = c.get("/ui/jobs", params={"q": "FINDABLE"}).text
        assert re.findall(r'<tr id="row-([0-9a-f]{32})"', found) == [one["id"]]
        assert 'value="FINDABLE"' in found and ">Clear</a>" in found
        tagged = c.get("/ui/jobs", params={"tag": "list-x"}).text
        assert re.findall(r'<tr id="row-([0-9a-f]{32})"', tagged) == [one["id"]]
        assert two["id"] not in tagged
        # the first page's event stream also watches for new jobs matching its filter
        assert "/ui/jobs/live?ids=" in tagged and "watch=1" in tagged and "tag=list-x" in tagged
        assert c.get("/ui/jobs/live", params={"watch": "1", "newest": "not a time"}).status_code == 422
        assert c.get("/ui/jobs/live", params={"watch": "1", "tag": "not a tag"}).status_code == 422
        assert c.get("/ui/jobs/live", params={"watch": "1", "status": "bogus"}).status_code == 422


def test_a_request_becomes_the_forms_values_widget_by_widget() -> None:
    from app.ui.forms import FormField, values_of

    fields = [FormField("layer_sets", "Layer groups", "checkboxes", options=["all", "visual", "text"]),
              FormField("n_steps", "Steps", "number"), FormField("tags", "Job tags", "tags"),
              FormField("filter", "Candidate filter", "group", optional_group=True,
                        children=[FormField("filter.n_hops", "Hops", "number")])]
    assert values_of({"layer_sets": ["all", "text"], "n_steps": 3, "tags": ["a", "b"], "filter": {"n_hops": 2},
                      "compare_with": None, "optimized": True, "checkpoints": ["c1"], "method": "ghost"},
                     fields) == {
        "layer_sets": ["all", "text"], "n_steps": "3", "tags": "a, b", "filter.n_hops": "2", "filter.__on": "on",
        "optimized": "true", "checkpoints": '["c1"]', "method": "ghost"}


def test_the_sdk_reads_a_models_vocabulary_and_estimates_a_run(server) -> None:
    import asyncio

    from explainq_client import AsyncClient, Client
    from explainq_client.errors import NotFoundError, ValidationError

    with Client(server, ALICE) as client:
        assert client.models.vocabulary(CONVE, "relations")["names"] == sorted(RELATIONS)
        assert client.models.vocabulary(CONVE, q="bu")["names"] == ["burma"]
        assert client.estimate("train-bdh", {"epochs": 2})["examples"] == 2 * 1294
        with pytest.raises(NotFoundError):
            client.estimate("tracin", {})
        with pytest.raises(ValidationError) as err:
            client.models.vocabulary(CONVE, limit=5000)
        assert err.value.fields == ["limit"]

    async def go() -> tuple[dict, dict]:
        async with AsyncClient(server, ALICE) as client:
            return (await client.models.vocabulary(CONVE, "entities", limit=2),
                    await client.estimate("train_conve", {"name": "m", "epochs": 1}))

    vocab, estimate = asyncio.run(go())
    assert vocab["names"] == sorted(ENTITIES)[:2] and estimate["per_epoch"] == 2 * 1592
