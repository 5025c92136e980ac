"""A fanned-out job has at most ``EXPLAINQ_MAX_SHARDS`` shards: a fixed ``shard_size`` that would make more is a
422 naming ``shard_size`` where the API can count the items, a failed job naming it where only the worker can;
``auto`` grows to fit."""

from __future__ import annotations

import pytest

from core import registry
from core.fanout import shard_count, too_many_shards
from tests.service import api_client

SAMPLE = {"id": "a", "history": ["Lakers win the title"], "candidate": "Dodgers sign a pitcher"}


def test_shard_count_and_the_message() -> None:
    assert [shard_count(n, 3) for n in (0, 1, 3, 4, 9, 10)] == [0, 1, 1, 2, 3, 4]
    assert too_many_shards(10, 5, 2, "samples") is None
    msg = too_many_shards(1592, 1, 100, "candidate training triples")
    assert msg.startswith("shard_size 1: 1,592 candidate training triples would make 1,592 shards, more than the 100")
    assert "EXPLAINQ_MAX_SHARDS" in msg and "shard_size 16 or more" in msg


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    home = tmp_path_factory.mktemp("shard-cap")
    with api_client(home, EXPLAINQ_MAX_SHARDS="4") as c:
        settings = c.app.state.settings
        model = home / "model"
        model.mkdir()
        (model / "config.json").write_text("{}")
        registry.register_model(settings, "news-x", kind="news", loader="models.news.checkpoint:load", path=model)
        registry.register_model(settings, "conve-x", kind="conve", loader="models.kg.checkpoint:load", path=model,
                                meta={"train_triples": 1592})
        news = home / "news-mine" / "test"
        news.mkdir(parents=True)
        (news / "news.tsv").write_text("N1\ta\tb\tTitle\t\t\t\t\n")
        (news / "behaviors.tsv").write_text("1\tU1\tt\tN1\tN1-1\n")
        registry.register_dataset(settings, "news-mine", kind="news", path=news.parent)
        yield c


def test_attributions_refuse_a_shard_size_that_makes_too_many_shards(client) -> None:
    body = {"model": "news-x", "samples": [{**SAMPLE, "id": str(i)} for i in range(9)]}
    assert client.post("/attributions", json={**body, "shard_size": 3}).status_code == 202  # 3 shards
    r = client.post("/attributions", json={**body, "shard_size": 2})  # 5 shards
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "shard_size"] and "would make 5 shards, more than the 4" in err["msg"], err
    assert client.post("/attributions", json={**body, "shard_size": "auto"}).status_code == 202
    r = client.post("/attributions", json={"model": "news-x", "shard_size": 1,
                                           "dataset": {"name": "news-mine", "split": "test", "n_samples": 5}})
    assert r.status_code == 422 and "shard_size" in r.text, r.text


def test_tracin_counts_the_models_training_triples(client, monkeypatch) -> None:
    from core.kinds import tracin

    monkeypatch.setattr(tracin, "model_vocab", lambda settings, model: {
        "entities": {"a": 0, "b": 1}, "relations": {"r": 0}, "checkpoints": ["ck1"], "inline": True})
    test = {"model": "conve-x", "mode": "test", "test_triples": [["a", "r", "b"]], "top_k": 5}
    r = client.post("/tracin", json={**test, "shard_size": 1})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "shard_size"] and "1,592 candidate training triples" in err["msg"], err
    assert client.post("/tracin", json={**test, "shard_size": 398}).status_code == 202  # 4 shards
    r = client.post("/tracin", json={"model": "conve-x", "mode": "self", "top_k": 5, "shard_size": 100})
    assert r.status_code == 422 and "16 shards" in r.text, r.text


class _Request:
    def __init__(self, shard_size):
        self.shard_size = shard_size


def test_the_worker_grows_auto_and_refuses_a_fixed_size_it_could_not_count_before() -> None:
    from workers.context import JobError
    from workers.fanout import capped_shard_size

    assert capped_shard_size(_Request("auto"), 1592, 8, 100, "candidates") == 16  # 100 shards of at most 16
    assert capped_shard_size(_Request(4), 400, 4, 100, "candidates") == 4
    with pytest.raises(JobError, match="shard_size 1: 1,592 candidates would make 1,592 shards") as exc:
        capped_shard_size(_Request(1), 1592, 1, 100, "candidates")
    assert exc.value.code == "invalid_request"
    with pytest.raises(JobError, match="would make 300 shards, more than the 100"):
        capped_shard_size(object(), 300, 1, 100, "models")
