from __future__ import annotations

import json

import pytest

from app import registry
from app.paths import PathError, resolve_data_path
from app.settings import Settings


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


def test_registry_round_trip_with_relative_paths(settings, tmp_path):
    registry.register_model(settings, "m", kind="k", loader="a.b:c", path=tmp_path / "models" / "m", parameters=3)
    registry.register_dataset(settings, "d", kind="lora", path="data/sets/a", meta={"n": 1})
    data = json.loads((tmp_path / "registry.json").read_text())
    assert data["models"]["m"]["path"] == "models/m"
    assert registry.absolute_path(settings, registry.get_model(settings, "m")) == tmp_path / "models" / "m"
    assert registry.get_dataset(settings, "d")["meta"] == {"n": 1}
    assert registry.get_model(settings, "nope") is None


def test_malformed_api_keys_raise():
    with pytest.raises(ValueError, match="name:key"):
        _ = Settings(EXPLAINQ_API_KEYS="justakey").api_keys
    assert Settings(EXPLAINQ_API_KEYS="a:1, b:2").api_keys == {"1": "a", "2": "b"}
