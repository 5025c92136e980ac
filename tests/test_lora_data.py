"""LoRA datasets: key parsing, both file formats, splits, generator determinism."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from models.lora.data import LoraDataset, sample_layers, stratified_split
from models.lora.keys import (
    REPRESENTATION_NAMES,
    DatasetFormatError,
    layer_group,
    pair_layers,
    parse_factor_key,
    read_safetensors_header,
    summarize_dataset,
)
from models.lora.representations import REPRESENTATIONS
from models.lora.synthetic import generate_dataset, sd15_layer_specs

TINY = dict(num_classes=3, per_class=6, width_divisor=32, max_blocks=2, seed=3)


def test_key_spellings_pair_per_layer() -> None:
    keys = [
        "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.processor.to_q_lora.down.weight",
        "unet.down_blocks.0.attentions.0.transformer_blocks.0.attn1.processor.to_q_lora.up.weight",
        "unet.mid_block.attentions.0.transformer_blocks.0.attn2.to_k.lora.down.weight",
        "unet.mid_block.attentions.0.transformer_blocks.0.attn2.to_k.lora.up.weight",
        "lora_unet_up_blocks_1_attentions_0_transformer_blocks_0_attn1_to_v.lora_down.weight",
        "lora_unet_up_blocks_1_attentions_0_transformer_blocks_0_attn1_to_v.lora_up.weight",
        "lora_unet_up_blocks_1_attentions_0_transformer_blocks_0_attn1_to_v.alpha",
        "unet.up_blocks.1.attentions.0.transformer_blocks.0.attn2.to_out.0.lora_A.weight",
        "unet.up_blocks.1.attentions.0.transformer_blocks.0.attn2.to_out.0.lora_B.weight",
        "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight",  # no partner
        "some.other.weight",
    ]
    layers, unpaired = pair_layers(keys)
    by_name = {layer.name: layer for layer in layers}
    assert len(layers) == 4
    assert unpaired == ["lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"]
    kohya = by_name["lora_unet_up_blocks_1_attentions_0_transformer_blocks_0_attn1_to_v"]
    assert kohya.alpha == kohya.name + ".alpha" and kohya.group == "visual"
    assert kohya.down.endswith("lora_down.weight") and kohya.up.endswith("lora_up.weight")
    peft = by_name["unet.up_blocks.1.attentions.0.transformer_blocks.0.attn2.to_out.0"]
    assert peft.down.endswith("lora_A.weight") and peft.group == "text"
    assert parse_factor_key("x.attn1.to_q.lora.up.weight") == ("x.attn1.to_q", "up")
    assert parse_factor_key("x.weight") is None
    assert layer_group("down_blocks.0.attn10.to_q") == "other"  # attn10 is not attn1


def test_representation_names_match_torch_side() -> None:
    assert tuple(REPRESENTATIONS) == REPRESENTATION_NAMES


def test_sd15_shapes() -> None:
    specs = sd15_layer_specs()
    assert len(specs) == 128
    assert sum(".attn1." in s.path for s in specs) == 64
    to_k2 = [s for s in specs if s.path.endswith("attn2.to_k")]
    assert {s.in_features for s in to_k2} == {768} and {s.out_features for s in to_k2} == {320, 640, 1280}


@pytest.mark.parametrize("naming", ["diffusers", "kohya"])
def test_format1_loads_both_namings(tmp_path, naming: str) -> None:
    root = generate_dataset(tmp_path / naming, naming=naming, rank=2, **TINY)
    ds = LoraDataset(root)
    assert len(ds) == 18 and ds.num_classes == 3
    assert ds.num_layers() == {"all": 16, "visual": 8, "text": 8}
    summary = summarize_dataset(root)
    assert summary.num_layers == ds.num_layers() and summary.classes == ds.classes
    factors = ds.load_layers(ds.layers[:2])
    f = factors[ds.layers[0].name]
    assert f.down.shape[0] == 18 and f.down.shape[1] == 2 and f.up.shape[2] == 2
    assert torch.all(f.scale == 1.0)  # kohya alpha == rank -> scale 1; diffusers has no alpha


def test_kohya_alpha_scale_and_header(tmp_path) -> None:
    d = tmp_path / "ds"
    d.mkdir()
    for i in range(4):
        save_file({"lora_unet_x_attn1_to_q.lora_down.weight": torch.randn(2, 8),
                   "lora_unet_x_attn1_to_q.lora_up.weight": torch.randn(6, 2),
                   "lora_unet_x_attn1_to_q.alpha": torch.tensor(4.0)}, str(d / f"{i}.safetensors"))
    (d / "labels.csv").write_text("file,label\n" + "".join(f"{i}.safetensors,{'ab'[i % 2]}\n" for i in range(4)))
    header = read_safetensors_header(d / "0.safetensors")
    assert header["lora_unet_x_attn1_to_q.lora_up.weight"]["shape"] == [6, 2]
    ds = LoraDataset(d)
    f = ds.load_layers(ds.layers)["lora_unet_x_attn1_to_q"]
    assert torch.allclose(f.scale, torch.full((4,), 2.0))  # alpha / rank


def test_bad_datasets(tmp_path) -> None:
    root = generate_dataset(tmp_path / "ok", **TINY)
    (root / "labels.csv").rename(root / "other.csv")
    with pytest.raises(DatasetFormatError, match="labels"):
        LoraDataset(root)
    one = generate_dataset(tmp_path / "one", num_classes=1, per_class=4, width_divisor=32, max_blocks=1)
    with pytest.raises(DatasetFormatError, match="class"):
        LoraDataset(one)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.safetensors").write_bytes(struct.pack("<Q", 5) + b"nope!")
    (bad / "labels.csv").write_text("file,label\nx.safetensors,a\n")
    with pytest.raises(DatasetFormatError):
        read_safetensors_header(bad / "x.safetensors")


def test_generator_is_deterministic(tmp_path) -> None:
    a = generate_dataset(tmp_path / "a", **TINY)
    b = generate_dataset(tmp_path / "b", **TINY)
    for f in sorted(p.name for p in a.iterdir()):
        assert hashlib.sha256((a / f).read_bytes()).digest() == hashlib.sha256((b / f).read_bytes()).digest()
    assert LoraDataset(a).fingerprint() == LoraDataset(b).fingerprint()


def test_fingerprint_tracks_content_and_memo(tmp_path) -> None:
    root = generate_dataset(tmp_path / "a", **TINY)
    memo = tmp_path / "memo.json"
    fp = LoraDataset(root).fingerprint(memo)
    assert json.loads(memo.read_text())
    assert LoraDataset(root).fingerprint(memo) == fp
    generate_dataset(tmp_path / "other", **{**TINY, "seed": 4})
    (tmp_path / "other" / "lora_00000.safetensors").replace(root / "lora_00000.safetensors")
    assert LoraDataset(root).fingerprint(memo) != fp


def test_stratified_split() -> None:
    labels = np.repeat(np.arange(4), [50, 30, 20, 10])
    s = stratified_split(labels, seed=1)
    all_idx = np.concatenate([s.train, s.val, s.test])
    assert sorted(all_idx.tolist()) == list(range(len(labels)))
    for c, n in enumerate([50, 30, 20, 10]):
        assert (labels[s.val] == c).sum() == round(0.1 * n)
        assert (labels[s.test] == c).sum() == round(0.2 * n)
    again = stratified_split(labels, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(s.__dict__.values(), again.__dict__.values(), strict=True))
    assert not np.array_equal(stratified_split(labels, seed=2).test, s.test)
    with pytest.raises(DatasetFormatError):
        stratified_split(np.array([0, 1, 0, 1]), seed=0)


def test_sample_layers(tmp_path) -> None:
    ds = LoraDataset(generate_dataset(tmp_path / "a", **TINY))
    half = sample_layers(ds.layers, 0.5, seed=7)
    assert len(half) == 8 and half == sample_layers(ds.layers, 0.5, seed=7)
    assert [x.name for x in half] == sorted(x.name for x in half)
    assert sample_layers(ds.layers, 1.0, seed=7) == ds.layers


def test_format2_matches_format1(tmp_path) -> None:
    pytest.importorskip("datasets")
    from models.lora.synthetic import to_hf_disk

    root = generate_dataset(tmp_path / "f1", naming="kohya", **TINY)
    hf = to_hf_disk(root, tmp_path / "f2")
    a, b = LoraDataset(root), LoraDataset(hf)
    assert b.format == "hf_disk" and a.format == "safetensors_dir"
    assert [x.name for x in a.layers] == [x.name for x in b.layers]
    assert np.array_equal(a.labels, b.labels) and a.classes == b.classes
    assert summarize_dataset(hf).num_layers == a.num_layers()
    fa, fb = a.load_layers(a.layers[:3]), b.load_layers(b.layers[:3])
    for name in fa:
        assert torch.equal(fa[name].down.float(), fb[name].down.float())
        assert torch.equal(fa[name].up.float(), fb[name].up.float())
        assert torch.allclose(fa[name].scale, fb[name].scale)
