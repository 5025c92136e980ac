"""Small text classifiers over token ids exported with ``torch.export``, for the token-input tests (nothing is
downloaded): a mean-pooled embedding bag with an MLP head that takes an attention mask and a dynamic sequence
length, and a one-layer transformer (learned positions, LayerNorm, one self-attention head, a GELU feed-forward,
mean pooling) over a static length of 8 tokens. Both share :data:`VOCAB`, a WordPiece-style vocabulary ("##"
continues a word)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

VOCAB = ["[PAD]", "[MASK]", "[CLS]", "the", "movie", "was", "good", "bad", "great", "dull", "act", "##ing", "plot",
         "but", "very", "not", "fun", "##ny", "and", "story", "end", "##ed", "well", "poor"]
PAD, MASK, CLS = 0, 1, 2
LABELS = ["negative", "neutral", "positive"]
STATIC_LENGTH = 8


class BagText(torch.nn.Module):
    """Embeddings, mean over the attended positions that are not padding, Linear-tanh-Linear."""

    def __init__(self, vocab: int = len(VOCAB), dim: int = 6, classes: int = 3):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim, padding_idx=PAD)
        self.hidden = torch.nn.Linear(dim, 8)
        self.out = torch.nn.Linear(8, classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = ((mask > 0) & (ids != PAD)).unsqueeze(-1).to(torch.float32)  # aten.__and__, as BERT's mask has it
        pooled = (self.embed(ids) * m).sum(1) / m.sum(1).clamp(min=1.0)
        return self.out(torch.tanh(self.hidden(pooled)))


class TinyTransformer(torch.nn.Module):
    """Token and learned position embeddings, one pre-norm self-attention layer and feed-forward, mean pooling."""

    def __init__(self, vocab: int = len(VOCAB), dim: int = 8, length: int = STATIC_LENGTH, classes: int = 3):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, dim)
        self.positions = torch.nn.Embedding(length, dim)
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.ff = torch.nn.Sequential(torch.nn.Linear(dim, 16), torch.nn.GELU(), torch.nn.Linear(16, dim))
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.tokens(ids) + self.positions(pos)
        q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)
        h = h + torch.nn.functional.scaled_dot_product_attention(q, k, v)
        h = h + self.ff(self.norm2(h))
        return self.head(h.mean(1))


def _init(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return model.eval()


def bag_text(seed: int = 0) -> BagText:
    return _init(BagText(), seed)  # type: ignore[return-value]


def tiny_transformer(seed: int = 0) -> TinyTransformer:
    return _init(TinyTransformer(), seed)  # type: ignore[return-value]


BAG_SPEC: dict[str, Any] = {
    "input": {"kind": "tokens", "name": "ids", "embedding": "embed.weight", "max_tokens": 32, "pad_id": PAD,
              "mask_id": MASK, "special_ids": [CLS], "vocabulary": "vocab.txt", "attention_mask": "mask"},
    "labels": LABELS}
TRANSFORMER_SPEC: dict[str, Any] = {
    "input": {"kind": "tokens", "embedding": "tokens.weight", "pad_id": PAD, "mask_id": MASK,
              "special_ids": [CLS], "vocabulary": "vocab.txt"},
    "labels": LABELS}


def export_bag(model: torch.nn.Module, path: Path) -> Path:
    ids = torch.tensor([[CLS, 3, 4, 5, 6], [CLS, 7, 8, 9, PAD]])
    batch, tokens = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("tokens", min=1, max=32)
    program = torch.export.export(model, (ids, (ids != PAD).long()),
                                  dynamic_shapes=({0: batch, 1: tokens}, {0: batch, 1: tokens}))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return path


def export_transformer(model: torch.nn.Module, path: Path) -> Path:
    ids = torch.randint(3, len(VOCAB), (2, STATIC_LENGTH))
    program = torch.export.export(model, (ids,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return path


def save_token_dir(directory: Path, kind: str = "bag", seed: int = 0, spec: dict[str, Any] | None = None
                   ) -> tuple[Path, torch.nn.Module]:
    """A model directory (``model.pt2``, ``spec.json``, ``vocab.txt``) of the ``bag`` or ``transformer`` model."""
    model = bag_text(seed) if kind == "bag" else tiny_transformer(seed)
    (export_bag if kind == "bag" else export_transformer)(model, directory / "model.pt2")
    (directory / "spec.json").write_text(json.dumps(spec if spec is not None else
                                                    BAG_SPEC if kind == "bag" else TRANSFORMER_SPEC))
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return directory, model
