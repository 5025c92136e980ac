"""Chunks of news samples for attribution passes, shared by IG (:mod:`models.news.attribution`) and the
faithfulness curves (:mod:`models.news.faithfulness`): which samples go together (:func:`length_chunks`) and, for
one chunk, the inputs, baselines and attributed function (:func:`build_chunk`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from models.news.modules import NewsRecommender, pack_rows


class PreparedLike(Protocol):
    """What a chunk reads of a prepared sample (``models.news.attribution``'s): its cached user vector and, per
    view, the unpadded token ids and attention mask."""

    user: torch.Tensor  # (D,)
    enc: dict[str, tuple[torch.Tensor, torch.Tensor]]  # view -> (ids (L,), mask (L,))


@dataclass
class Chunk:
    x: torch.Tensor  # (b, L, E)
    base: torch.Tensor  # (b, L, E)
    content: torch.Tensor  # (b, L) positions that differ from the baseline
    lengths: list[int]
    forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    users: torch.Tensor  # (b, D)
    ids: torch.Tensor  # (b, L)


def pad_stack(seqs: Sequence[torch.Tensor], value: int) -> torch.Tensor:
    length = max(int(s.shape[0]) for s in seqs)
    out = torch.full((len(seqs), length), value, dtype=seqs[0].dtype)
    for i, s in enumerate(seqs):
        out[i, : s.shape[0]] = s
    return out


def can_pack(model: NewsRecommender) -> bool:
    """Whether the model encodes several candidates per row (NRMS with a word or BERT/RoBERTa-style encoder)."""
    return len(model.views) == 1 and bool(getattr(model, "packable", False))


def build_chunk(model: NewsRecommender, items: Sequence[PreparedLike], view: str, baseline: str,
                pack: bool = False) -> Chunk:
    """Inputs, baselines and the attributed function of a chunk of samples. With ``pack`` (single-view models
    only) the forward strips each row's padding and encodes the rows packed several to a sequence
    (:func:`models.news.modules.pack_rows`, at most twice the longest row's tokens each), so padding costs no
    FLOPs and samples of different lengths share one batched pass."""
    dev = model.device
    tok = model.tokenizer
    pad = tok.pad_id
    ids = pad_stack([p.enc[view][0] for p in items], pad).to(dev)
    mask = pad_stack([p.enc[view][1] for p in items], 0).to(dev)
    special = torch.tensor([[int(i) in tok.special_ids for i in row] for row in ids.tolist()], device=dev)
    content = (mask == 1) & ~special
    with torch.no_grad():
        x = model.embed(view, ids).float()
        if baseline == "pad":
            base = model.embed(view, torch.where(content, torch.full_like(ids, pad), ids)).float()
        else:
            base = torch.where(content[..., None], torch.zeros_like(x), x)
        others: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for ov in model.views:
            if ov == view:
                continue
            o_ids = pad_stack([p.enc[ov][0] for p in items], pad).to(dev)
            o_mask = pad_stack([p.enc[ov][1] for p in items], 0).to(dev)
            others[ov] = (model.embed(ov, o_ids), o_mask)
    users = torch.stack([p.user for p in items]).to(dev)
    lengths = [int(p.enc[view][0].shape[0]) for p in items]
    if pack and not can_pack(model):
        raise ValueError(f"{model.kind} cannot encode packed rows")
    if pack:
        capacity = 2 * max(lengths)

        def forward(xs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            m, width, dim = xs.shape
            layout = pack_rows([lengths[r] for r in rows.tolist()], width, capacity, xs.device)
            flat = torch.cat([xs.reshape(m * width, dim), xs.new_zeros(1, dim)])
            news = model.news_from_packed(flat[layout.index], layout.positions, layout.segments,
                                          layout.n_segments)
            news = news.reshape(-1, news.shape[-1])[layout.slot]
            return (news.float() * users[rows]).sum(-1)
    else:
        def forward(xs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            embeds = {view: xs}
            masks = {view: mask[rows]}
            for ov, (emb, m) in others.items():
                embeds[ov] = emb[rows]
                masks[ov] = m[rows]
            news = model.news_from_embeddings(embeds, masks)
            return (news.float() * users[rows]).sum(-1)

    return Chunk(x, base, content, lengths, forward, users, ids)


def length_chunks(lengths: Sequence[int], batch_size: int, exact: bool) -> list[list[int]]:
    """Sample indices sorted by length, cut into chunks of at most ``batch_size``. With ``exact`` a chunk also
    ends where the length changes, so no chunk carries padding (on CPU, padding costs FLOPs in proportion; on
    CUDA fewer, larger launches matter more and chunks are only sorted)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out and len(out[-1]) < batch_size and (not exact or lengths[out[-1][-1]] == lengths[i]):
            out[-1].append(i)
        else:
            out.append([i])
    return out
