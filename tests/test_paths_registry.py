from __future__ import annotations

import json

import pytest

from core import registry
from core.settings import Settings
from core.userfiles import PathError, resolve_data_path


@pytest.fixture
def settings(tmp_path):
    (tmp_path / "data" / "sets" / "a").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return Settings(EXPLAINQ_HOME=str(tmp_path))


def test_relative_and_absolute_paths_inside_roots_resolve(settings, tmp_path):
    assert resolve_data_path(settings, "sets/a") == tmp_path / "data" / "sets" / "a"
    assert resolve_data_path(settings, str(tmp_path / "data" / "sets")) == tmp_path / "data" / "sets"


@pytest.mark.parametrize("raw", ["../outside", "sets/../../outside", "/etc", ""])
def test_escapes_are_rejected(settings, raw):
    with pytest.raises(PathError):
        resolve_data_path(settings, raw)


def test_symlink_out_of_roots_is_rejected(settings, tmp_path):
    (tmp_path / "data" / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(PathError, match="outside the data roots"):
        resolve_data_path(settings, "link")


def test_missing_path_is_reported(settings):
    with pytest.raises(PathError, match="does not exist"):
        resolve_data_path(settings, "sets/zzz")
    assert resolve_data_path(settings, "sets/zzz", must_exist=False).name == "zzz"


def test_several_data_roots(tmp_path):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r2" / "x").mkdir(parents=True)
    s = Settings(EXPLAINQ_HOME=str(tmp_path), EXPLAINQ_DATA_ROOTS=f"{tmp_path / 'r1'}:{tmp_path / 'r2'}")
    assert resolve_data_path(s, "x") == tmp_path / "r2" / "x"


def test_registry_round_trip_in_redis_with_store_versions(redis_settings, tmp_path):
    settings = redis_settings
    src = tmp_path / "build" / "m"
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}')
    entry = registry.register_model(settings, "m", kind="k", loader="a.b:c", path=src, parameters=3, owner="alice")
    assert entry["location"].startswith("models/m/") and entry["owner"] == "alice"
    got = registry.get_model(settings, "m")
    assert got == entry
    local = registry.local_path(settings, got)
    assert (local / "config.json").read_text() == '{"a": 1}'
    assert local.is_relative_to(settings.home / "store")  # a local store is read in place
    assert registry.read_file(settings, got, "config.json") == b'{"a": 1}'
    registry.register_dataset(settings, "d", kind="lora", path=tmp_path / "data" / "sets" / "a", meta={"n": 1})
    assert registry.get_dataset(settings, "d")["meta"] == {"n": 1}
    assert registry.get_dataset(settings, "d")["path"] == str(tmp_path / "data" / "sets" / "a")
    assert registry.get_model(settings, "nope") is None
    assert list(registry.list_models(settings)) == ["m"]


def test_only_the_owner_replaces_or_deletes(redis_settings, tmp_path):
    settings = redis_settings
    src = tmp_path / "m"
    src.mkdir()
    (src / "w").write_text("1")
    first = registry.register_model(settings, "m", kind="k", loader="a:b", path=src, owner="alice")
    with pytest.raises(registry.OwnershipError, match="alice"):
        registry.register_model(settings, "m", kind="k", loader="a:b", path=src, owner="bob")
    with pytest.raises(registry.OwnershipError):
        registry.delete(settings, "models", "m", "bob")
    assert registry.get_model(settings, "m")["location"] == first["location"]
    second = registry.register_model(settings, "m", kind="k", loader="a:b", path=src, owner="alice")
    assert second["location"] != first["location"]  # a replacement is a new immutable version
    # the replaced version waits for gc; the new one is referenced
    from core.retention import collect

    removed = collect(settings, grace_s=0)
    assert first["location"] in removed["versions"]
    assert not registry.store(settings).exists(first["location"])
    assert registry.store(settings).exists(second["location"] + "/w")
    assert registry.delete(settings, "models", "m", "alice")["owner"] == "alice"
    assert registry.get_model(settings, "m") is None
    assert registry.delete(settings, "models", "m", "alice") is None


def test_concurrent_registrations_of_one_name_by_two_owners_one_wins(redis_settings, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    settings = redis_settings
    src = tmp_path / "m"
    src.mkdir()
    (src / "w").write_text("1")

    def attempt(owner: str) -> str:
        try:
            registry.register_model(settings, "shared", kind="k", loader="a:b", path=src, owner=owner)
            return owner
        except registry.OwnershipError:
            return ""

    with ThreadPoolExecutor(8) as pool:
        winners = {w for w in pool.map(attempt, [f"o{i % 4}" for i in range(16)]) if w}
    assert len(winners) == 1
    assert registry.get_model(settings, "shared")["owner"] in winners


def test_legacy_registry_json_is_imported_once(redis_server, tmp_path):
    import redis

    from core.settings import Settings

    redis.Redis.from_url(redis_server.url).flushdb()
    model_dir = tmp_path / "models" / "old"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    (tmp_path / "registry.json").write_text(json.dumps({
        "models": {"old": {"kind": "conve", "loader": "x:y", "path": "models/old", "parameters": 5}},
        "datasets": {"ds": {"kind": "triples", "path": "data/sets/a"}}}))
    registry._IMPORTED.clear()
    settings = Settings(EXPLAINQ_HOME=str(tmp_path), REDIS_URL=redis_server.url)
    entry = registry.get_model(settings, "old")
    assert entry["owner"] == "system" and entry["preload"] and entry["parameters"] == 5
    assert (registry.local_path(settings, entry) / "config.json").is_file()
    assert registry.get_dataset(settings, "ds")["path"] == str(tmp_path / "data" / "sets" / "a")
    assert not (tmp_path / "registry.json").exists() and (tmp_path / "registry.json.imported").exists()


def test_malformed_api_keys_raise():
    with pytest.raises(ValueError, match="name:key"):
        _ = Settings(EXPLAINQ_API_KEYS="justakey").api_keys
    assert Settings(EXPLAINQ_API_KEYS="a:1, b:2").api_keys == {"1": "a", "2": "b"}
