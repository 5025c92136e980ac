"""The memory admission counts a dataset named as a directory (``./bigkg``, or a bare name that is a directory)
exactly as the same directory registered: its entities and relations, as ``POST /datasets`` counts them."""

from __future__ import annotations

import pytest

from tests.service import api_client

ALICE = {"Authorization": "Bearer key-a"}
N_ENTITIES = 20_000  # ConvE at embedding_dim 200, batch_size 128: about 276 MiB against 136 MiB for a tiny graph


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("dir-admission")
    data = home / "data"
    for name, n in (("bigkg", N_ENTITIES), ("smallkg", 6)):
        (data / name).mkdir(parents=True)
        half = n // 2
        (data / name / "train.txt").write_text("".join(f"e{i}\tr{i % 4}\te{i + half}\n" for i in range(half)))
    with api_client(home, EXPLAINQ_API_KEYS="alice:key-a", EXPLAINQ_WORKER_MEMORY_BYTES=str(200 * 2**20)) as c:
        yield {"client": c, "data": data}


def _refusal(r) -> str:
    assert r.status_code == 422, r.text
    (first, *_) = r.json()["detail"]
    return first["msg"]


def test_a_directory_is_counted_as_the_same_directory_registered(env) -> None:
    c = env["client"]
    r = c.post("/datasets", json={"name": "big-registered", "path": "bigkg"}, headers=ALICE)
    assert r.status_code == 201 and r.json()["counts"]["entities"] == N_ENTITIES, r.text
    body = {"name": "big-model", "embedding_dim": 200, "batch_size": 128}
    registered = _refusal(c.post("/train/conve", json={**body, "dataset": "big-registered"}, headers=ALICE))
    assert f"({N_ENTITIES} entities, 4 relations)" in registered
    for named in ("./bigkg", "bigkg"):  # a path, and a bare name that is a directory under the data roots
        msg = _refusal(c.post("/train/conve", json={**body, "dataset": named}, headers=ALICE))
        assert f"({N_ENTITIES} entities, 4 relations)" in msg, msg
        assert msg.split(" would need ")[1] == registered.split(" would need ")[1]  # the same estimate
    assert c.post("/train/conve", json={**body, "dataset": "./smallkg"}, headers=ALICE).status_code == 202


@pytest.mark.parametrize("route", ["/evaluate/attribution", "/evaluate/mislabel"])
def test_the_evaluations_count_a_directory_too(env, route: str) -> None:
    c = env["client"]
    recipe = {"embedding_dim": 200, "batch_size": 128}
    r = c.post(route, json={"dataset": "./bigkg", "recipe": recipe}, headers=ALICE)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["body", "recipe"], r.text


def test_a_directory_that_is_not_a_triples_graph_names_the_field(env) -> None:
    (env["data"] / "notkg").mkdir()
    (env["data"] / "notkg" / "train.txt").write_text("only two\tfields\n")
    r = env["client"].post("/train/conve", json={"name": "x-model", "dataset": "./notkg"}, headers=ALICE)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "dataset"], r.text
    assert "/" not in r.json()["detail"][0]["msg"].replace("notkg/train.txt", "")  # no server path
