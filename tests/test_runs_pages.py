"""Training runs on the dashboard: the per-step curve on a job page, the overlay of several runs with their
hyper-parameters (the caller's own runs only), and the models page's links, actions and owner-only delete.
A real service (private Redis, a real worker) trains tiny ConvE runs."""

from __future__ import annotations

import html as htmlmod
import json
import re

import pytest

from core.contract.charts import TRAIN_COLOUR

KEYS = "alice:runs-key-alice-0123456789,bob:runs-key-bob-0123456789"
ALICE, BOB = "runs-key-alice-0123456789", "runs-key-bob-0123456789"
TINY = {"dataset": "nations", "epochs": 2, "batch_size": 256, "embedding_dim": 20, "embedding_height": 4,
        "num_filters": 4, "checkpoint_every": 1, "seed": 0}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    from core import registry
    from models.kg.triples import nations_dir
    from tests.service import Service

    home = tmp_path_factory.mktemp("runs-pages")
    with Service(home, api_keys=KEYS, heartbeat_ttl_s=20, env={"OMP_NUM_THREADS": "1"}) as s:
        registry.register_dataset(s.settings, "nations", kind="triples", path=nations_dir(), upload=True)
        jobs = {}
        for who, key, name, lr in (("a", ALICE, "conve-runs-a", 0.01), ("b", ALICE, "conve-runs-b", 0.003),
                                   ("bob", BOB, "conve-runs-bob", 0.01)):
            r = s.client.post("/train/conve", json={**TINY, "name": name, "lr": lr}, headers=_bearer(key))
            assert r.status_code == 202, r.text
            jobs[who] = r.json()["id"]
        for who, job_id in jobs.items():
            done = s.wait(job_id, timeout_s=120, headers=_bearer(BOB if who == "bob" else ALICE))
            assert done["status"] == "succeeded", (done, s.worker_logs())
        yield s, jobs


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _as(s, key: str):
    c = s.client
    c.cookies.clear()
    r = c.post("/ui/login", data={"api_key": key, "next": "/ui/jobs"}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return c


def _csrf(page: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def test_job_page_draws_the_step_curve_first_in_the_train_colour(svc) -> None:
    s, jobs = svc
    c = _as(s, ALICE)
    result = c.get(f"/jobs/{jobs['a']}/result", headers=_bearer(ALICE)).json()
    assert 2 <= len(result["steps"]) <= 200 and result["steps"][-1]["epoch"] == 2.0
    page = c.get(f"/ui/jobs/{jobs['a']}").text
    steps = json.loads(htmlmod.unescape(re.search(r'data-steps="([^"]*)"', page).group(1)))
    assert steps == result["steps"]
    charts = [json.loads(htmlmod.unescape(x)) for x in re.findall(r'data-chart="([^"]*)"', page)]
    assert charts[0]["rows"] == "steps" and charts[0]["series"][0][2] == TRAIN_COLOUR
    assert f'href="/ui/runs?kind=train_conve&amp;ids={jobs["a"]}"' in page
    assert 'href="/ui/models#model-conve-runs-a"' in page


def test_overlay_shows_both_runs_and_the_differing_hyper_parameters(svc) -> None:
    s, jobs = svc
    c = _as(s, ALICE)
    r = c.get("/ui/runs", params={"kind": "train_conve", "ids": f"{jobs['a']},{jobs['b'][:10]}"})
    assert r.status_code == 200, r.text
    overlays = [json.loads(htmlmod.unescape(x)) for x in re.findall(r'data-overlay="([^"]*)"', r.text)]
    assert [o["id"] for o in overlays] == ["steps", "loss", "mrr"]
    for o in overlays:
        assert {x["run"] for x in o["series"]} == {jobs["a"], jobs["b"]}
        for x in o["series"]:
            assert len(x["values"]) == len(o["x"]) and any(v is not None for v in x["values"])
    loss = overlays[1]
    assert loss["x"] == [1, 2] and {x["colour"] for x in loss["series"]} == {"#0072B2", "#D55E00"}
    params = r.text[r.text.index("<h2>Hyper-parameters</h2>"):r.text.index("<h3>Last epoch</h3>")]
    rows = {name: bool(cls) for cls, name in
            re.findall(r'<tr( class="differs")?><th scope="row" class="mono[^"]*">([^<]+)</th>', params)}
    assert rows["lr"] is True and rows["name"] is True
    assert rows["embedding_dim"] is False and rows["epochs"] is False
    order = [n for n, _ in rows.items()]
    assert order.index("lr") < order.index("epochs")  # the differing fields first
    # the picker lists the caller's own runs of the kind, never another owner's
    assert jobs["a"] in r.text and jobs["bob"] not in r.text


def test_overlay_refuses_another_owners_run_and_bad_ids(svc) -> None:
    s, jobs = svc
    c = _as(s, ALICE)
    assert c.get("/ui/runs", params={"kind": "train_conve", "ids": f"{jobs['a']},{jobs['bob']}"}).status_code == 404
    assert c.get("/ui/runs", params={"ids": jobs["bob"]}).status_code == 404
    assert c.get("/ui/runs", params={"kind": "attributions"}).status_code == 422
    wrong = c.get("/ui/runs", params={"kind": "train_bdh", "ids": jobs["a"]})
    assert wrong.status_code == 422 and "is a train_conve job, not train_bdh" in wrong.text
    many = ",".join(f"{i:032x}" for i in range(9))
    r = c.get("/ui/runs", params={"kind": "train_conve", "ids": many})
    assert r.status_code == 422 and "at most 8 runs" in r.text
    c = _as(s, BOB)
    assert c.get("/ui/runs", params={"ids": jobs["a"]}).status_code == 404
    page = c.get("/ui/runs", params={"kind": "train_conve"}).text
    assert jobs["bob"] in page and jobs["a"] not in page


def test_models_page_links_the_job_offers_explain_and_owner_only_delete(svc) -> None:
    s, jobs = svc
    c = _as(s, ALICE)
    page = c.get("/ui/models").text
    row = re.search(r'<tr id="model-conve-runs-a">(.*?)</tr>', page, re.S).group(1)
    assert f'href="/ui/jobs/{jobs["a"]}"' in row
    assert 'href="/ui/new/tracin?model=conve-runs-a"' in row
    assert 'href="/ui/models/conve-runs-a/delete"' in row
    bobs = re.search(r'<tr id="model-conve-runs-bob">(.*?)</tr>', page, re.S).group(1)
    assert "/delete" not in bobs and f"/ui/jobs/{jobs['bob']}" not in bobs  # not alice's: no delete, no job link
    form = c.get("/ui/new/tracin", params={"model": "conve-runs-a"}).text
    assert re.search(r'<option value="conve-runs-a"\s+selected', form) or 'value="conve-runs-a" selected' in form

    assert c.get("/ui/models/conve-runs-bob/delete").status_code == 409
    confirm = c.get("/ui/models/conve-runs-b/delete")
    assert confirm.status_code == 200 and "cannot be undone" in confirm.text
    token = _csrf(confirm.text)
    refused = c.post("/ui/models/conve-runs-bob/delete", data={"csrf_token": token}, follow_redirects=False)
    assert refused.status_code == 409
    no_token = c.post("/ui/models/conve-runs-b/delete", data={}, follow_redirects=False)
    assert no_token.status_code == 403
    done = c.post("/ui/models/conve-runs-b/delete", data={"csrf_token": token}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/ui/models?deleted=conve-runs-b"
    after = c.get(done.headers["location"]).text
    assert 'id="model-conve-runs-b"' not in after and "was deleted" in after
    assert c.post("/ui/models/conve-runs-b/delete", data={"csrf_token": token},
                  follow_redirects=False).status_code == 404
    assert c.get("/ui/models/conve-runs-b/delete").status_code == 404
