"""The ablation experiment on synthetic datasets: planted signals, feature cache, resume."""

from __future__ import annotations

import pytest
import torch

from models.lora import features as F
from models.lora.data import LoraDataset
from models.lora.experiment import AblationConfig, format_table, run_ablation
from models.lora.synthetic import generate_dataset

CPU = torch.device("cpu")
SMALL = dict(num_classes=4, per_class=30, width_divisor=16, max_blocks=4, strength=0.8)
FAST = dict(num_runs=2, max_epochs=40, patience=10, hidden_dim=64, batch_size=64)


@pytest.fixture(scope="module")
def visual_signal(tmp_path_factory) -> LoraDataset:
    return LoraDataset(generate_dataset(tmp_path_factory.mktemp("v") / "ds", signal=("visual",), seed=1, **SMALL))


@pytest.fixture(scope="module")
def text_signal(tmp_path_factory) -> LoraDataset:
    return LoraDataset(generate_dataset(tmp_path_factory.mktemp("t") / "ds", signal=("text",), seed=2, **SMALL))


def test_attn1_signal_recovered_in_both_layer_sets(visual_signal: LoraDataset) -> None:
    cfg = AblationConfig(representations=["spectral", "simple_stats"], layer_sets=["all", "visual"], **FAST)
    res = run_ablation(visual_signal, cfg, CPU)
    for ls in ("all", "visual"):
        for rep in ("spectral", "simple_stats"):
            assert res["results"][ls][rep]["test_acc"]["mean"] >= 0.75, (ls, rep, res["results"][ls][rep])
    assert set(res["drop"]) == {"spectral", "simple_stats"}
    assert res["num_layers"] == {"all": 32, "visual": 16, "text": 16}
    assert "spectral" in format_table(res)


def test_attn2_only_signal_leaves_visual_at_chance(text_signal: LoraDataset) -> None:
    cfg = AblationConfig(representations=["spectral"], layer_sets=["all", "visual", "text"], **FAST)
    res = run_ablation(text_signal, cfg, CPU)
    acc = {ls: res["results"][ls]["spectral"]["test_acc"]["mean"] for ls in ("all", "visual", "text")}
    assert acc["all"] >= 0.75 and acc["text"] >= 0.75
    assert acc["visual"] <= 0.45  # chance is 0.25
    d = res["drop"]["spectral"]
    assert d["absolute"] == pytest.approx(acc["all"] - acc["visual"]) and d["relative"] > 0.4


def test_feature_cache_hits_and_invalidation(tmp_path, monkeypatch) -> None:
    root = generate_dataset(tmp_path / "ds", num_classes=2, per_class=10, width_divisor=32, max_blocks=2, seed=5)
    cache = tmp_path / "cache"
    reqs = ["simple_stats", "spectral_delta"]

    def features(ds: LoraDataset):
        return F.compute_features(ds, {"all": ds.layer_set("all"), "visual": ds.layer_set("visual")}, reqs, CPU,
                                  F.FeatureCache(cache), memo_path=cache / "fingerprints.json")

    first, s1 = features(LoraDataset(root))
    assert len(s1.computed) == 4 and not s1.cached
    calls = []
    real = F.layer_features
    monkeypatch.setattr(F, "layer_features", lambda *a, **k: calls.append(a) or real(*a, **k))
    second, s2 = features(LoraDataset(root))
    assert not s2.computed and len(s2.cached) == 4 and not calls  # a second run computes nothing
    for key in first:
        assert torch.equal(first[key].features, second[key].features)
    # the visual columns of "all" are the visual layer set's features
    ds = LoraDataset(root)
    vis = [x.name for x in ds.layer_set("visual")]
    assert torch.equal(second[("all", "simple_stats")].select(vis), second[("visual", "simple_stats")].features)
    # new code version -> miss
    monkeypatch.setattr(F, "FEATURE_CODE_VERSION", "test-bump")
    _, s3 = features(LoraDataset(root))
    assert len(s3.computed) == 4
    monkeypatch.undo()
    # changed content -> miss
    other = generate_dataset(tmp_path / "other", num_classes=2, per_class=10, width_divisor=32, max_blocks=2, seed=6)
    (other / "lora_00003.safetensors").replace(root / "lora_00003.safetensors")
    _, s4 = features(LoraDataset(root))
    assert len(s4.computed) == 4 and not s4.cached


def test_resume_after_failure_and_sampling(tmp_path, visual_signal: LoraDataset) -> None:
    cfg = AblationConfig(representations=["simple_stats", "stats"], layer_sets=["all", "visual"],
                         sample_layers=0.5, **{**FAST, "num_runs": 1, "max_epochs": 5})
    seen = []

    def failing(done: int, total: int, message: str) -> None:
        seen.append((done, total))
        if done == 3:
            raise RuntimeError("worker died")

    with pytest.raises(RuntimeError):
        run_ablation(visual_signal, cfg, CPU, cache_dir=tmp_path / "c", state_dir=tmp_path / "s", progress=failing)
    assert seen[-1] == (3, 4)
    done = []
    res = run_ablation(visual_signal, cfg, CPU, cache_dir=tmp_path / "c", state_dir=tmp_path / "s",
                       progress=lambda d, t, m: done.append(d))
    assert res["timing"]["resumed_cells"] == 3 and done[0] == 3 and done[-1] == 4
    assert res["layers_used"] == {"all": 16, "visual": 8}
    assert res["results"]["all"]["simple_stats"]["feature_dim"] == 16 * 10
    fresh = run_ablation(visual_signal, cfg, CPU)
    assert fresh["results"]["all"]["stats"]["test_acc"] == res["results"]["all"]["stats"]["test_acc"]


def test_unknown_inputs_rejected(visual_signal: LoraDataset) -> None:
    with pytest.raises(ValueError, match="representation"):
        run_ablation(visual_signal, AblationConfig(representations=["nope"]), CPU)
    with pytest.raises(ValueError, match="layer set"):
        run_ablation(visual_signal, AblationConfig(layer_sets=["audio"]), CPU)
