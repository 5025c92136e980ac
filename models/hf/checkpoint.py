"""Load a Hugging Face sequence classifier that a tenant brought, running none of its code.

The directory is first read as data (:func:`models.hf.files.inspect_checkpoint`: no ``auto_map``, safetensors
weights, a fast tokenizer); transformers then builds the model class it has for the config's ``model_type``
(``trust_remote_code=False``), loads the weights from the safetensors files only (``use_safetensors=True``) and
the tokenizer from ``tokenizer.json``, with ``local_files_only=True`` (nothing is downloaded). Every tensor of the
model must come from the weights (a missing one, which transformers would initialise at random, is refused). The
loaded model is in eval mode with its parameters frozen: explanations differentiate with respect to inputs only
(``POST /train/classifier`` loads its own copy with ``trainable=True``: ``models.hf.train``).

The service loads only copies it made of the files :func:`models.hf.files.checkpoint_files` names (the import job's
staging directory, then the store's version), so nothing else a tenant put in the directory is ever opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.files import LOCAL, FileAccess
from models.hf.files import CheckpointInfo, inspect_checkpoint

LOAD = dict(local_files_only=True, trust_remote_code=False)


@dataclass
class HFClassifier:
    """A loaded classifier: the transformers model (eval, frozen), its fast tokenizer, its class names."""

    model: Any
    tokenizer: Any
    labels: list[str]
    info: CheckpointInfo
    path: Path

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def embeddings(self) -> torch.nn.Module:
        """The token embedding table whose output IG attributes (``get_input_embeddings``)."""
        return self.model.get_input_embeddings()

    @torch.no_grad()
    def logits(self, texts: list[str]) -> torch.Tensor:
        """``[n, n_labels]`` logits of ``texts``, one text per pass (no padding: exact for every architecture)."""
        out = []
        for text in texts:
            enc = self.tokenizer(text, return_tensors="pt", truncation=True).to(self.device)
            out.append(self.model(**enc).logits[0].float().cpu())
        return torch.stack(out)


def dims(clf: HFClassifier) -> dict[str, int | None]:
    """The transformer's width, depth and heads from its config (the names differ by family), for the memory
    estimate of fine-tuning it (``core.kinds.train_classifier.fine_tune_bytes``)."""
    config = clf.model.config

    def first(*names: str) -> int | None:
        value = next((getattr(config, n) for n in names if isinstance(getattr(config, n, None), int)), None)
        return int(value) if value is not None else None

    return {"hidden": first("hidden_size", "dim", "n_embd", "d_model"),
            "layers": first("num_hidden_layers", "n_layers", "n_layer", "num_layers"),
            "heads": first("num_attention_heads", "n_heads", "n_head")}


def load(path: str | Path, device: torch.device | str = "cpu", files: FileAccess = LOCAL,
         trainable: bool = False) -> HFClassifier:
    """The classifier in ``path`` on ``device`` (a registered model's loader: ``models.hf.checkpoint:load``), in eval
    mode; ``trainable``: its parameters keep requiring gradients (a fine-tuning job's own copy)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = Path(path)
    info = inspect_checkpoint(path, files)
    model, loading = AutoModelForSequenceClassification.from_pretrained(path, use_safetensors=True,
                                                                        output_loading_info=True, **LOAD)
    missing = sorted(loading.get("missing_keys") or ())
    if missing:  # transformers would initialise them at random: a classifier head that was never trained
        raise ValueError(f"the safetensors weights lack {len(missing)} of the {info.architecture}'s tensors "
                         f"({', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''}); save the trained "
                         "classifier itself with model.save_pretrained(directory, safe_serialization=True)")
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(trainable)
    tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True, **LOAD)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("the checkpoint's tokenizer is not a fast tokenizer (tokenizer.json)")
    return HFClassifier(model, tokenizer, info.labels, info, path)
