"""The names of the service's own data and demo models (shipped graphs, demo datasets and models) are reserved:
a tenant cannot register, train or import under them; the service's own registration still works, and demo
preparation fails, naming the holder, on a tenant's registration from before the name was reserved."""

from __future__ import annotations

import json

import pytest

from core import keys, registry
from tests.service import api_client

ALICE = {"Authorization": "Bearer key-a"}


def test_the_reserved_lists_cover_every_demo_step_and_shipped_dataset() -> None:
    from core.kinds.train_bdh import CIFAR_DIRS
    from core.kinds.train_conve import SHIPPED_COUNTS
    from workers.demo import demo_steps

    steps = demo_steps()
    assert {m for s in steps for m in s.models} <= registry.RESERVED["models"]
    assert {d for s in steps for d in s.datasets} | set(SHIPPED_COUNTS) | set(CIFAR_DIRS) \
        <= registry.RESERVED["datasets"]


def test_the_registry_refuses_a_reserved_name_to_a_tenant_not_to_the_service(redis_settings, tmp_path) -> None:
    src = tmp_path / "m"
    src.mkdir()
    (src / "config.json").write_text("{}")
    with pytest.raises(registry.ReservedNameError, match="'umls' is reserved"):
        registry.register_dataset(redis_settings, "umls", kind="triples", path=src, owner="bob")
    with pytest.raises(registry.ReservedNameError, match="'conve-kinships-demo' is reserved"):
        registry.register_model(redis_settings, "conve-kinships-demo", kind="conve", loader="a:b", path=src,
                                owner="bob")
    assert registry.get_dataset(redis_settings, "umls") is None
    assert registry.get_model(redis_settings, "conve-kinships-demo") is None
    registry.register_dataset(redis_settings, "umls", kind="triples", path=src)  # the service's own
    registry.register_model(redis_settings, "conve-kinships-demo", kind="conve", loader="a:b", path=src)
    assert registry.system_entry(redis_settings, "datasets", "umls")["owner"] == registry.SYSTEM
    registry.register_model(redis_settings, "conve-kinships-demo", kind="conve", loader="a:b", path=src)  # again
    registry.register_dataset(redis_settings, "bob-kg", kind="triples", path=src, owner="bob")  # others are free


def _legacy(settings, section: str, name: str, owner: str) -> None:
    """A record written before the name was reserved (straight into Redis, as an older version left it)."""
    entry = {"name": name, "kind": "triples" if section == "datasets" else "conve", "owner": owner,
             "meta": {}, "created_at": "2026-01-01T00:00:00+00:00", "path": "/nowhere"}
    registry.connection(settings).hset(keys.registry(section), name, json.dumps(entry))


def test_demo_preparation_fails_naming_a_tenant_that_holds_a_reserved_name(redis_settings, monkeypatch) -> None:
    from workers.jobs import train_conve as job

    _legacy(redis_settings, "models", "conve-umls-demo", "bob")
    _legacy(redis_settings, "datasets", "kinships", "alice")
    for name, dataset in (("conve-umls-demo", "umls"), ("conve-kinships-demo", "kinships")):
        with pytest.raises(registry.ReservedNameError, match="registered by '(bob|alice)'.*DELETE /"):
            job.prepare_one(redis_settings, name, dataset, {}, progress=False)
    assert registry.get_model(redis_settings, "conve-umls-demo")["owner"] == "bob"  # never replaced silently
    assert registry.get_model(redis_settings, "conve-kinships-demo") is None  # never trained on alice's graph
    assert registry.get_dataset(redis_settings, "umls")["owner"] == registry.SYSTEM  # the shipped graph went in


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    home = tmp_path_factory.mktemp("reserved")
    data = home / "data" / "tiny-kg"
    data.mkdir(parents=True)
    (data / "train.txt").write_text("a\tr\tb\nb\tr\tc\n")
    with api_client(home, EXPLAINQ_API_KEYS="alice:key-a") as c:
        yield c


@pytest.mark.parametrize(("route", "body", "field"), [
    ("/datasets", {"name": "umls", "path": "tiny-kg"}, "name"),
    ("/datasets", {"name": "news-synthetic", "path": "tiny-kg"}, "name"),
    ("/train/conve", {"name": "conve-kinships-demo", "dataset": "nations"}, "name"),
    ("/train/conve", {"name": "conve-kinships-demo", "dataset": "nations", "overwrite": True}, "name"),
    ("/train/news", {"name": "nrms-minilm-demo", "dataset": "news-synthetic"}, "name"),
    ("/train/classifier", {"name": "digits-cnn-demo", "model": "digits-cnn-demo", "dataset": "digits-tensors"},
     "name"),
    ("/train/bdh", {"dataset": "digits", "epochs": 1, "register_as": "naml-demo"}, "register_as"),
    ("/models/import", {"kind": "conve", "name": "conve-nations-demo", "path": "tiny-kg"}, "name"),
])
def test_a_tenant_cannot_take_a_reserved_name(client, route: str, body: dict, field: str) -> None:
    """Refused before anything else the request names is read (none of these demos is registered here)."""
    r = client.post(route, json=body, headers=ALICE)
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert detail["code"] == "reserved_name" and detail["loc"] == ["body", field], detail
    assert "reserved" in detail["message"]
