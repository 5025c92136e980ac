"""The worker's model cache under a memory budget, and garbage collection of unreachable files."""

from __future__ import annotations

import json

import redis
import torch

from core import keys, registry
from core.artifacts import artifacts_key, record_owner
from core.keys import JOB_PREFIX
from core.retention import collect
from workers.model_cache import ModelCache, estimate_nbytes


def load_tensor_model(path, device):
    """A 'model' of a known size: ``size.json`` says how many float32 values it holds."""
    n = json.loads((path / "size.json").read_text())["n"]
    return {"weights": torch.zeros(n, dtype=torch.float32, device=device)}


def _register(settings, tmp_path, name: str, n: int) -> None:
    d = tmp_path / "src" / name
    d.mkdir(parents=True)
    (d / "size.json").write_text(json.dumps({"n": n}))
    registry.register_model(settings, name, kind="test", loader="tests.test_store_gc:load_tensor_model", path=d)


def test_estimate_nbytes_counts_tensors_once():
    t = torch.zeros(10)
    module = torch.nn.Linear(4, 3)  # 12 weights + 3 biases
    assert estimate_nbytes({"a": t, "b": [t], "m": module}) == 40 + 15 * 4


def test_least_recently_used_models_leave_memory_first(redis_settings, tmp_path):
    for name in ("a", "b", "c"):
        _register(redis_settings, tmp_path, name, 1000)  # 4000 bytes each
    cache = ModelCache(redis_settings, "cpu", budget_bytes=9000)  # room for two
    cache.get("a")
    cache.get("b")
    cache.get("a")  # a is now the most recently used
    cache.get("c")  # over budget: b goes
    assert cache.loaded_names() == ["a", "c"]
    cache.get("b")
    assert cache.load_counts == {"a": 1, "b": 2, "c": 1}
    # a model larger than the whole budget still loads (alone)
    _register(redis_settings, tmp_path, "big", 10_000)
    cache.get("big")
    assert cache.loaded_names() == ["big"]


def test_a_replaced_model_is_reloaded_and_only_preload_models_load_at_start(redis_settings, tmp_path):
    _register(redis_settings, tmp_path, "a", 10)
    d = tmp_path / "src" / "p"
    d.mkdir(parents=True)
    (d / "size.json").write_text(json.dumps({"n": 3}))
    registry.register_model(redis_settings, "p", kind="test", loader="tests.test_store_gc:load_tensor_model",
                            path=d, preload=True)
    cache = ModelCache(redis_settings, "cpu")
    assert cache.preload() == ["p"]
    assert cache.get("a")["weights"].numel() == 10
    (tmp_path / "src" / "a" / "size.json").write_text(json.dumps({"n": 20}))
    registry.register_model(redis_settings, "a", kind="test", loader="tests.test_store_gc:load_tensor_model",
                            path=tmp_path / "src" / "a")
    assert cache.get("a")["weights"].numel() == 20


def test_gc_deletes_the_files_of_expired_jobs_only(redis_settings, tmp_path):
    r = redis.Redis.from_url(redis_settings.redis_url)
    store = registry.store(redis_settings)
    for job_id in ("live", "expired"):
        src = tmp_path / job_id
        src.mkdir()
        (src / "out.txt").write_text(job_id)
        store.sync_dir(src, artifacts_key(job_id))
        record_owner(redis_settings, job_id, "alice", "test")
    r.hset(JOB_PREFIX + "live", "status", "finished")
    removed = collect(redis_settings)
    assert removed["artifacts"] == ["expired"]
    assert store.exists(artifacts_key("live", "out.txt"))
    assert not store.exists(artifacts_key("expired"))
    assert r.hkeys(keys.ARTIFACT_OWNERS) == [b"live"]


def test_gc_keeps_recent_unregistered_uploads_and_deletes_old_ones(redis_settings, tmp_path):
    store = registry.store(redis_settings)
    src = tmp_path / "v"
    src.mkdir()
    (src / "f").write_text("x")
    store.put_dir(src, "models/orphan/20200101T000000-abcdef012345")  # an upload that was never registered
    store.put_dir(src, "models/orphan/29990101T000000-abcdef012345")  # one still being registered (future)
    removed = collect(redis_settings, grace_s=3600)
    assert removed["versions"] == ["models/orphan/20200101T000000-abcdef012345"]
    assert store.exists("models/orphan/29990101T000000-abcdef012345/f")


def test_feature_matrices_computed_on_one_host_are_reused_on_another(tmp_path):
    from core.filestore import Store
    from models.lora.features import FeatureCache, LayerSetFeatures
    from workers.jobs.ablations import StoreFeatureTier

    store = Store(str(tmp_path / "store"), tmp_path / "unused")
    host_a = FeatureCache(tmp_path / "a", StoreFeatureTier(store))
    host_b = FeatureCache(tmp_path / "b", StoreFeatureTier(store))
    value = LayerSetFeatures(torch.arange(6, dtype=torch.float32).reshape(2, 3), ["l1", "l2"], [0, 1, 3])
    assert host_b.load("k1") is None
    host_a.save("k1", value, {"representation": "x"})
    got = host_b.load("k1")
    assert torch.equal(got.features, value.features) and got.layer_names == ["l1", "l2"]
    assert (tmp_path / "b" / "k1.safetensors").is_file()  # now in host b's local tier too


def test_gc_removes_gradient_features_once_their_model_version_is_gone(redis_settings, tmp_path):
    """Features a featurize job stored for a model version stay while that version is registered or still in the
    store (its grace period), and go with it; features with no record of their model are left alone."""
    from workers.jobs.featurize import record_model

    store = registry.store(redis_settings)
    _register(redis_settings, tmp_path, "conve-gc", 1)
    location = registry.get_model(redis_settings, "conve-gc")["location"]
    seg = tmp_path / "seg"
    seg.mkdir()
    (seg / "features.npy").write_bytes(b"x")
    for key in ("k-model", "k-unrecorded"):
        store.put_dir(seg, f"features/{key}/segment-0")
    record_model(store, ["k-model"], location)
    record_model(store, ["k-model"], location)  # recorded once
    assert json.loads(store.read_bytes("features/k-model/models.json")) == [location]
    assert collect(redis_settings)["features"] == []
    registry.unregister(redis_settings, "models", "conve-gc")
    assert collect(redis_settings, grace_s=3600)["features"] == []  # the version is released but still stored
    store.delete(location)  # its grace period is over and retention removed it
    assert collect(redis_settings)["features"] == ["features/k-model"]
    assert not store.exists("features/k-model/segment-0/features.npy")
    assert store.exists("features/k-unrecorded/segment-0/features.npy")


def test_gc_collects_shared_features_and_evaluation_caches_nobody_used_for_the_cache_ttl(redis_settings, tmp_path):
    """Shared, content-addressed entries (features, what evaluations trained) are collected once unused for
    EXPLAINQ_CACHE_TTL_S; an entry with no record of its use starts its clock at the first pass; a use resets it."""
    from core import lastuse
    from core.settings import Settings

    settings = Settings(EXPLAINQ_HOME=redis_settings.home_dir, REDIS_URL=redis_settings.redis_url,
                        EXPLAINQ_CACHE_TTL_S=100)
    store = registry.store(settings)
    entries = ["features/f-old", "features/f-fresh", "cache/evaluation/models/m-old", "cache/evaluation/lds/l-new"]
    for entry in entries:
        store.put_bytes(b"x", f"{entry}/part.bin")
    now = 1_000_000.0
    lastuse.touch(store, ["features/f-old", "cache/evaluation/models/m-old"], now - 500)
    lastuse.touch(store, ["features/f-fresh"], now - 50)
    removed = collect(settings, now=now)
    assert sorted(removed["unused"]) == ["cache/evaluation/models/m-old", "features/f-old"]
    assert not store.exists("features/f-old/part.bin") and store.exists("features/f-fresh/part.bin")
    assert lastuse.last_used(store, "features/f-old") is None  # its record went with it
    assert lastuse.last_used(store, "cache/evaluation/lds/l-new") == now  # unrecorded: the clock starts now
    lastuse.touch(store, ["features/f-fresh"], now + 40)  # used again
    assert collect(settings, now=now + 101)["unused"] == ["cache/evaluation/lds/l-new"]
    assert store.exists("features/f-fresh/part.bin")
    off = Settings(EXPLAINQ_HOME=redis_settings.home_dir, REDIS_URL=redis_settings.redis_url, EXPLAINQ_CACHE_TTL_S=0)
    assert collect(off, now=now + 10**9)["unused"] == []


def test_gc_releases_the_claims_of_jobs_whose_record_expired_and_keeps_a_kept_jobs(redis_settings, tmp_path):
    from core import keys, lastuse
    from core.keys import JOB_PREFIX
    from core.settings import Settings

    settings = Settings(EXPLAINQ_HOME=redis_settings.home_dir, REDIS_URL=redis_settings.redis_url)
    store = registry.store(settings)
    r = registry.connection(settings)
    live, gone, kept = "a" * 32, "b" * 32, "c" * 32
    r.hset(JOB_PREFIX + live, "status", "finished")
    r.hset(keys.KEPT, kept, "1")
    for job_id in (live, gone, kept, f"{kept}-shard-0"):
        lastuse.claim(store, "alice", job_id, ["features/k1"])
    assert collect(settings)["claims"] == [f"alice/{gone}"]
    assert lastuse.claims(store, "alice") == {"features/k1": {live, kept, f"{kept}-shard-0"}}
