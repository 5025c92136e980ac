"""The ablation experiment on synthetic datasets: planted signals, feature cache, resume."""

from __future__ import annotations

import numpy as np
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
    n_visual = res["layers_used"]["visual"]
    assert res["layers_used"]["all"] == 16 and 0 < n_visual < 16
    assert res["results"]["all"]["simple_stats"]["feature_dim"] == 16 * 10
    assert res["results"]["visual"]["simple_stats"]["feature_dim"] == n_visual * 10
    fresh = run_ablation(visual_signal, cfg, CPU)
    assert fresh["results"]["all"]["stats"]["test_acc"] == res["results"]["all"]["stats"]["test_acc"]


def test_unknown_inputs_rejected(visual_signal: LoraDataset) -> None:
    with pytest.raises(ValueError, match="representation"):
        run_ablation(visual_signal, AblationConfig(representations=["nope"]), CPU)
    with pytest.raises(ValueError, match="layer set"):
        run_ablation(visual_signal, AblationConfig(layer_sets=["audio"]), CPU)


def test_sampled_visual_layers_are_the_sampled_sets_visual_part(visual_signal: LoraDataset, monkeypatch) -> None:
    from models.lora.keys import select_layers

    requested: list[dict] = []
    real = F.compute_features

    def recording(dataset, requests, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        requested.append({ls: [x.name for x in layers] for ls, layers in requests.items()})
        return real(dataset, requests, *args, **kwargs)

    import models.lora.experiment as E

    monkeypatch.setattr(E, "compute_features", recording)
    cfg = AblationConfig(representations=["simple_stats"], layer_sets=["all", "visual"], sample_layers=0.25,
                         **{**FAST, "num_runs": 1, "max_epochs": 2})
    run_ablation(visual_signal, cfg, CPU)
    (req,) = requested
    assert len(req["all"]) == 8  # only the sampled layers are read and featurised
    all_layers = [x for x in visual_signal.layer_set("all") if x.name in set(req["all"])]
    assert req["visual"] == [x.name for x in select_layers(all_layers, "visual")]


def test_paired_drop_over_repeated_splits(text_signal: LoraDataset) -> None:
    cfg = AblationConfig(representations=["simple_stats"], layer_sets=["all", "visual"],
                         **{**FAST, "num_runs": 3, "max_epochs": 15})
    res = run_ablation(text_signal, cfg, CPU)
    assert res["synthetic"] is True and res["splits"]["n_splits"] == 3
    runs_all = res["results"]["all"]["simple_stats"]["runs"]
    runs_vis = res["results"]["visual"]["simple_stats"]["runs"]
    assert [r["split"] for r in runs_all] == [r["split"] for r in runs_vis] == [0, 1, 2]
    acc = [r["test_acc"] for r in runs_all]
    assert res["results"]["all"]["simple_stats"]["test_acc"]["std"] == pytest.approx(float(np.std(acc, ddof=1)))
    diffs = np.array(acc) - np.array([r["test_acc"] for r in runs_vis])
    paired = res["drop"]["simple_stats"]["paired"]
    assert paired["mean"] == pytest.approx(diffs.mean()) and paired["std"] == pytest.approx(diffs.std(ddof=1))
    t = 4.302652729911275  # t(0.975, 2 dof)
    naive = t * diffs.std(ddof=1) / np.sqrt(3)
    assert paired["ci_naive"] == pytest.approx([diffs.mean() - naive, diffs.mean() + naive])
    # Nadeau-Bengio: the three splits share data, so the variance is σ²·(1/J + n_test/n_train)
    ratio = res["splits"]["test"] / res["splits"]["train"]
    half = t * np.sqrt(diffs.var(ddof=1) * (1 / 3 + ratio))
    assert paired["ci"] == pytest.approx([diffs.mean() - half, diffs.mean() + half]) and half > naive
    table = format_table(res)
    assert "SYNTHETIC" in table.splitlines()[0] and "95% CI" in table
    # the splits differ from run to run
    from models.lora.data import stratified_split
    from models.lora.experiment import split_seed

    a, b = (stratified_split(text_signal.labels, split_seed(cfg.seed, k)) for k in (0, 1))
    assert not np.array_equal(np.sort(a.test), np.sort(b.test))
