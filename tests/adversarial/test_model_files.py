"""A registered model's files (a ConvE model's config.json and id dictionaries, a classifier's config.json and
tokenizer files) are read by the bounded parser, never in the API process: a config too large for the parser's
memory is a 413 naming it as ``<model>/config.json``, one that is not JSON a 422, and the API does not grow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.service import api_client

ALICE = {"Authorization": "Bearer key-a"}
MiB = 1 << 20


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("model-files-home")
    with api_client(home, EXPLAINQ_API_KEYS="alice:key-a", EXPLAINQ_PARSER_MEMORY_BYTES=str(384 * MiB),
                    EXPLAINQ_PARSER_CPU_S="20", EXPLAINQ_PARSER_TIMEOUT_S="60") as client:
        yield {"client": client, "home": home, "settings": client.app.state.settings}


def _conve(env, name: str, config: bytes | None = None) -> Path:
    """A registered ConvE model (toy vocabulary, no weights); ``config`` replaces its config.json in the store."""
    from core import registry

    d = env["home"] / "src" / name
    (d / "data").mkdir(parents=True)
    (d / "data" / "entities.dict").write_text("a\t0\nb\t1\n")
    (d / "data" / "relations.dict").write_text("r\t0\n")
    (d / "config.json").write_text(json.dumps({"checkpoints": [{"file": "checkpoints/epoch_0001.safetensors",
                                                                "epoch": 1, "lr": 0.01}]}))
    entry = registry.register_model(env["settings"], name, kind="conve", loader="models.kg.checkpoint:load", path=d)
    stored = registry.local_path(env["settings"], entry)
    if config is not None:
        (stored / "config.json").write_bytes(config)
    return stored


def _classifier(env, name: str, config: dict, tokenizer: dict) -> dict:
    from core import registry

    d = env["home"] / "src" / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    (d / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return registry.register_model(env["settings"], name, kind="hf_classifier", loader="models.hf.load:load",
                                   path=d)


def _booby_trap(monkeypatch) -> None:
    """Every read of a registered model's file in this (the API's) process fails the test."""
    from core import registry

    def boom(*_a, **_k):
        raise AssertionError("a model file's content was read in the API process")

    monkeypatch.setattr(registry.read_file, "__code__", boom.__code__)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def _messages(response) -> str:
    detail = response.json()["detail"]
    return " | ".join(d["msg"] for d in detail) if isinstance(detail, list) else detail["message"]


def test_a_conve_models_vocabulary_is_read_in_the_child(env, monkeypatch) -> None:
    _conve(env, "vocab-kg")
    _booby_trap(monkeypatch)
    r = env["client"].get("/models/vocab-kg/vocabulary", params={"field": "entities"}, headers=ALICE)
    assert r.status_code == 200, r.text
    assert r.json()["names"] == ["a", "b"]


def test_a_huge_conve_config_is_413_naming_it_and_the_api_does_not_grow(env) -> None:
    # one 64 MiB line of JSON: a list of 16M floats (over 500 MiB as Python objects)
    _conve(env, "huge-config-kg", b"[" + b"1.5," * (16 * MiB) + b"1.5]")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
    before = _status_kib("VmHWM")
    r = env["client"].post("/tracin", json={"model": "huge-config-kg", "test_triples": [["a", "r", "b"]]},
                           headers=ALICE)
    grown = (_status_kib("VmHWM") - before) * 1024
    assert r.status_code == 413, r.text
    assert r.json()["detail"]["code"] == "too_large"
    assert _messages(r) == ("huge-config-kg/config.json: reading it needed more than 384 MiB of memory "
                            "(EXPLAINQ_PARSER_MEMORY_BYTES)")
    assert str(env["home"]) not in r.text
    assert grown < 32 * MiB, grown  # read here, the file alone is 64 MiB


def test_a_conve_config_that_is_not_json_is_422_naming_it(env) -> None:
    _conve(env, "bad-config-kg", b"\x00not json")
    r = env["client"].post("/tracin", json={"model": "bad-config-kg", "test_triples": [["a", "r", "b"]]},
                           headers=ALICE)
    assert r.status_code == 422, r.text
    assert _messages(r) == ("bad-config-kg/config.json is not a model configuration (JSON with a list of "
                            "checkpoints)")
    assert str(env["home"]) not in r.text


def test_a_classifiers_labels_and_tokenizer_are_read_in_the_child(env, monkeypatch) -> None:
    from core.kinds.attributions import class_names, tokenizer_has

    entry = _classifier(env, "labels-clf", {"id2label": {"1": "pos", "0": "neg"}}, {"pad_token": "[PAD]"})
    _booby_trap(monkeypatch)
    assert class_names(env["settings"], entry) == ["neg", "pos"]
    assert tokenizer_has(env["settings"], entry, "pad") is True
    assert tokenizer_has(env["settings"], entry, "mask") is False


def test_a_huge_classifier_config_is_413_naming_it(env) -> None:
    from core import registry
    from core.contract.errors import FieldTooLarge
    from core.kinds.attributions import class_names

    entry = _classifier(env, "huge-clf", {}, {})
    (registry.local_path(env["settings"], entry) / "config.json").write_bytes(b"[" + b"1.5," * (16 * MiB) + b"1.5]")
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmHWM")
    with pytest.raises(FieldTooLarge) as caught:
        class_names(env["settings"], entry)
    assert (_status_kib("VmHWM") - before) * 1024 < 32 * MiB
    assert caught.value.message == ("huge-clf/config.json: reading it needed more than 384 MiB of memory "
                                    "(EXPLAINQ_PARSER_MEMORY_BYTES)")
