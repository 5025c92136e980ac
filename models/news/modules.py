"""NRMS and NAML news recommenders.

Both models expose the interface the attribution engine needs:

- ``views``: the text fields of a news item the model reads (``("title",)`` for NRMS, ``("title", "body")`` for NAML);
- ``tokenize(titles, bodies)`` -> ``{view: Encoded}``;
- ``embed(view, ids)``: the token embedding layer (the layer Integrated Gradients attributes);
- ``news_from_embeddings(embeds, masks)``: the rest of the news encoder, from embeddings to the news vector;
- ``user_vector(news_vecs, hist_mask)``: the user encoder;
- score = <news vector, user vector>.

NRMS (Wu et al. 2019): token encoder -> word-level multi-head self-attention -> additive attention = news vector;
user = additive attention over multi-head self-attention of the history news vectors.

NAML (Wu et al. 2019): per view a CNN over word embeddings with additive-attention pooling; attention over the
view vectors gives the news vector; user = additive attention over the history news vectors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.news.data import MAX_HISTORY, recent_history
from models.news.text import BertNewsTokenizer, Encoded, NewsTokenizer, WordTokenizer, resolve_pretrained


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax over ``dim`` where ``mask == 0`` entries get exactly zero weight. A row with no unmasked entry (an
    empty history) gets weight 0 everywhere, so attention pooling of nothing is the zero vector (not NaN)."""
    keep = mask != 0
    present = keep.any(dim=dim, keepdim=True)
    scores = scores.masked_fill(~keep, float("-inf")).masked_fill(~present, 0.0)
    return torch.softmax(scores, dim=dim) * present.to(scores.dtype)


class AdditiveAttention(nn.Module):
    """a_i = softmax_i(q^T tanh(W x_i + b)); returns sum_i a_i x_i."""

    def __init__(self, in_dim: int, query_dim: int):
        super().__init__()
        self.proj = nn.Linear(in_dim, query_dim)
        self.query = nn.Linear(query_dim, 1, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = self.query(torch.tanh(self.proj(x))).squeeze(-1)  # (B, L)
        weights = masked_softmax(scores, mask)
        return torch.einsum("bl,bld->bd", weights, x)

    def pool_segments(self, x: torch.Tensor, segments: torch.Tensor, n_segments: int) -> torch.Tensor:
        """Pool each segment of packed rows on its own: ``x`` ``(B, T, D)``, ``segments`` ``(B, T)`` the segment
        index of each position (-1: padding); returns ``(B, n_segments, D)`` (a row's unused segments are 0)."""
        scores = self.query(torch.tanh(self.proj(x))).squeeze(-1)  # (B, T)
        member = segments[:, None, :] == torch.arange(n_segments, device=x.device)[None, :, None]  # (B, S, T)
        # an unused segment gets one dummy position so its softmax stays finite; its weight is zeroed after
        empty = ~member.any(-1, keepdim=True)
        weights = masked_softmax(scores[:, None, :].expand(-1, n_segments, -1),
                                 member | (empty & (torch.arange(x.shape[1], device=x.device) == 0)))
        weights = weights * (~empty).to(weights.dtype)
        return torch.einsum("bst,btd->bsd", weights, x)


class MultiHeadSelfAttention(nn.Module):
    """NRMS multi-head self-attention: h heads of size d_h, output h*d_h; padded keys are masked out (or, with a
    ``(B, L, L)`` mask, every query sees only the keys its row of the mask allows)."""

    def __init__(self, in_dim: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.q = nn.Linear(in_dim, heads * head_dim)
        self.k = nn.Linear(in_dim, heads * head_dim)
        self.v = nn.Linear(in_dim, heads * head_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (lin(x).view(b, n, self.heads, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, h, L, L)
        # mask: (B, L) keys, or (B, L, L) query x key (packed rows: each title attends only to itself)
        attn = masked_softmax(scores, mask[:, None] if mask.dim() == 3 else mask[:, None, None, :])
        return (attn @ v).transpose(1, 2).reshape(b, n, self.heads * self.head_dim)


@dataclass(frozen=True)
class Packing:
    """Where the tokens of ``N`` right-padded sequences ``(N, L)`` go when packed several to a row of width ``T``:
    ``index`` ``(P, T)`` each slot's flat source position ``i * L + j`` (``N * L``: padding, read from an appended
    zero row), ``positions`` and ``segments`` ``(P, T)`` as :meth:`NRMS.news_from_packed` takes them, and
    ``slot`` ``(N,)`` the flat index ``p * n_segments + s`` of sequence ``i``'s result in a ``(P, n_segments)``
    output."""

    index: torch.Tensor
    positions: torch.Tensor
    segments: torch.Tensor
    slot: torch.Tensor
    n_segments: int


def pack_rows(lengths: Sequence[int], width: int, capacity: int, device: torch.device | str) -> Packing:
    """Pack sequences of ``lengths`` (each at most ``capacity``; stored in rows of ``width``) into rows of at most
    ``capacity`` tokens: the longest left opens a row, which the shortest left fill while they fit (O(N))."""
    n = len(lengths)
    if n == 0 or max(lengths) > capacity:
        raise ValueError("every length must be in [1, capacity]")
    order = sorted(range(n), key=lambda i: lengths[i])
    row_of, start_of, seg_of = [0] * n, [0] * n, [0] * n
    lo, hi, rows, n_seg, cols = 0, n - 1, 0, 1, 1
    while lo <= hi:
        members = [order[hi]]
        hi -= 1
        used = lengths[members[0]]
        while lo <= hi and used + lengths[order[lo]] <= capacity:
            members.append(order[lo])
            used += lengths[order[lo]]
            lo += 1
        start = 0
        for seg, i in enumerate(members):
            row_of[i], start_of[i], seg_of[i] = rows, start, seg
            start += lengths[i]
        n_seg, cols = max(n_seg, len(members)), max(cols, used)
        rows += 1
    lens = torch.tensor(lengths, dtype=torch.long)
    item = torch.repeat_interleave(torch.arange(n), lens)  # the sequence of every real token
    within = torch.arange(int(lens.sum())) - (torch.cumsum(lens, 0) - lens)[item]  # its position in it
    row_t, start_t, seg_t = torch.tensor(row_of), torch.tensor(start_of), torch.tensor(seg_of)
    dest = row_t[item] * cols + start_t[item] + within
    index = torch.full((rows * cols,), n * width, dtype=torch.long)
    index[dest] = item * width + within
    positions = torch.zeros(rows * cols, dtype=torch.long)
    positions[dest] = within
    segments = torch.full((rows * cols,), -1, dtype=torch.long)
    segments[dest] = seg_t[item]
    return Packing(index.view(rows, cols).to(device), positions.view(rows, cols).to(device),
                   segments.view(rows, cols).to(device), (row_t * n_seg + seg_t).to(device), n_seg)


class BertTokenEncoder(nn.Module):
    """A BERT-family encoder from a local transformers directory. ``embed`` is its word-embedding layer; the
    forward pass adds position/type embeddings, LayerNorm and every transformer layer (``inputs_embeds``)."""

    def __init__(self, pretrained: str = "minilm", fine_tune: bool = False, fine_tune_layers: int | None = None):
        super().__init__()
        from transformers import AutoModel

        self.pretrained = pretrained
        self.fine_tune = fine_tune
        # Eager attention on CPU: with bf16 autocast it runs on the CPU's bf16 matrix units, about 2x fp32,
        # while SDPA's masked CPU path in bf16 was slower than fp32. ``use_device_attention`` switches to SDPA
        # on CUDA.
        self.bert = AutoModel.from_pretrained(str(resolve_pretrained(pretrained)), local_files_only=True,
                                              attn_implementation="eager")
        self.out_dim = int(self.bert.config.hidden_size)
        # Packed rows give each title its own position ids, in the encoder's own convention: BERT counts from 0,
        # RoBERTa-style embeddings from padding_idx + 1. Other encoders are never packed.
        model_type = getattr(self.bert.config, "model_type", "")
        self.position_offset: int | None = (
            0 if model_type == "bert" else
            int(self.bert.embeddings.padding_idx) + 1 if model_type in ("roberta", "xlm-roberta", "camembert")
            else None)
        if not fine_tune:
            for p in self.bert.parameters():
                p.requires_grad_(False)
            self.bert.eval()
        elif fine_tune_layers is not None:  # only the last k transformer layers learn
            layers = self.bert.encoder.layer
            if not 1 <= fine_tune_layers <= len(layers):
                raise ValueError(f"fine_tune_layers must be in [1, {len(layers)}] for this encoder")
            for p in self.bert.parameters():
                p.requires_grad_(False)
            for layer in layers[len(layers) - fine_tune_layers:]:
                for p in layer.parameters():
                    p.requires_grad_(True)

    def train(self, mode: bool = True) -> BertTokenEncoder:
        super().train(mode)
        if not self.fine_tune:
            self.bert.eval()  # a frozen encoder never uses dropout
        return self

    def use_device_attention(self, device: torch.device) -> None:
        """SDPA (fused kernels) on CUDA, eager attention elsewhere."""
        self.bert.set_attn_implementation("sdpa" if torch.device(device).type == "cuda" else "eager")

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bert.embeddings.word_embeddings(ids)

    def forward(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.bert(inputs_embeds=embeds, attention_mask=mask).last_hidden_state

    @property
    def packable(self) -> bool:
        return self.position_offset is not None

    # A transformer's cost is per token (every layer's matmuls), so packing, which computes no padding, pays.
    pack_pays = True

    def forward_packed(self, embeds: torch.Tensor, positions: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """Several titles per row: ``positions`` restart at 0 for each title (shifted here to the encoder's own
        first position id) and ``block`` ``(B, T, T)`` (bool) lets a token attend only to the tokens of its own
        title, so each title is encoded exactly as alone."""
        if self.position_offset is None:
            raise ValueError(f"packed rows are not supported for {self.bert.config.model_type} encoders")
        positions = positions + self.position_offset
        additive = torch.zeros(block.shape, dtype=embeds.dtype, device=embeds.device)
        additive = additive.masked_fill(~block, torch.finfo(embeds.dtype).min)[:, None]
        return self.bert(inputs_embeds=embeds, attention_mask=additive, position_ids=positions).last_hidden_state


class WordEmbeddingEncoder(nn.Module):
    """Word embeddings (optionally GloVe-initialised) followed by dropout."""

    def __init__(self, vocab_size: int, dim: int = 128, dropout: float = 0.2):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.dropout = nn.Dropout(dropout)
        self.out_dim = dim

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)

    def forward(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.dropout(embeds)

    packable = True  # position-free and per token: packing changes nothing
    # ... but it does not pay: an embedding lookup costs next to nothing per padded token, while the word-level
    # attention over rows packed to twice the longest title costs more than the padding saved (measured: IG of
    # 250 samples with nrms-word-demo took 5.1-5.9 s packed against 2.1 s in padded chunks, one thread).
    pack_pays = False

    def forward_packed(self, embeds: torch.Tensor, positions: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        return self.dropout(embeds)


def load_glove(path: str | Path, tokenizer: WordTokenizer, dim: int) -> tuple[torch.Tensor, int]:
    """Rows of a GloVe text file (``word v1 ... vd``) for the tokenizer's vocabulary; returns the table and the
    number of words found. Missing words keep a small random init; [PAD] is zero."""
    table = torch.randn(len(tokenizer.itos), dim) * 0.1
    table[0] = 0.0
    found = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = line.rstrip().split(" ")
            idx = tokenizer.stoi.get(parts[0])
            if idx is None or idx == 0:
                continue
            if len(parts) - 1 != dim:
                raise ValueError(f"GloVe file {path} has dimension {len(parts) - 1}, expected {dim}")
            table[idx] = torch.tensor([float(v) for v in parts[1:]])
            found += 1
    return table, found


class NewsRecommender(nn.Module):
    """Shared plumbing for NRMS and NAML."""

    kind: str
    views: tuple[str, ...]
    tokenizer: NewsTokenizer
    config: dict[str, Any]

    def tokenize(self, titles: Sequence[str], bodies: Sequence[str] | None = None) -> dict[str, Encoded]:
        out = {"title": self.tokenizer.encode(titles, self.config["max_title_len"])}
        if "body" in self.views:
            bodies = list(bodies) if bodies is not None else [""] * len(titles)
            out["body"] = self.tokenizer.encode(bodies, self.config["max_body_len"])
        return out

    def embed(self, view: str, ids: torch.Tensor) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def news_from_embeddings(self, embeds: dict[str, torch.Tensor], masks: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover - interface

    def user_vector(self, news_vecs: torch.Tensor, hist_mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover - interface

    def encode_news(self, enc: dict[str, Encoded]) -> torch.Tensor:
        dev = self.device
        embeds = {v: self.embed(v, e.ids.to(dev)) for v, e in enc.items()}
        return self.news_from_embeddings(embeds, {v: e.mask.to(dev) for v, e in enc.items()})

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def score_texts(
        self,
        history: Sequence[str],
        candidates: Sequence[str],
        history_bodies: Sequence[str] | None = None,
        candidate_bodies: Sequence[str] | None = None,
        max_history: int = MAX_HISTORY,
    ) -> torch.Tensor:
        """The model's own scores of ``candidates`` for one user with this ``history`` (``(C,)``); the user vector
        is built from the last ``max_history`` titles, as in training and attribution."""
        history, history_bodies = recent_history(history, history_bodies, max_history)
        hist = self.encode_news(self.tokenize(history, history_bodies))  # (H, D)
        user = self.user_vector(hist[None], torch.ones(1, hist.shape[0], device=hist.device))  # (1, D)
        cand = self.encode_news(self.tokenize(candidates, candidate_bodies))  # (C, D)
        return cand @ user[0]


class NRMS(NewsRecommender):
    kind = "nrms"
    views = ("title",)

    def __init__(self, tokenizer: NewsTokenizer, token_encoder: nn.Module, config: dict[str, Any]):
        super().__init__()
        self.tokenizer = tokenizer
        self.config = config
        self.token_encoder = token_encoder
        heads, head_dim, query_dim = config["heads"], config["head_dim"], config["query_dim"]
        self.word_attn = MultiHeadSelfAttention(token_encoder.out_dim, heads, head_dim)
        self.word_pool = AdditiveAttention(heads * head_dim, query_dim)
        self.user_attn = MultiHeadSelfAttention(heads * head_dim, heads, head_dim)
        self.user_pool = AdditiveAttention(heads * head_dim, query_dim)
        self.dropout = nn.Dropout(config.get("dropout", 0.2))

    def embed(self, view: str, ids: torch.Tensor) -> torch.Tensor:
        if view != "title":
            raise KeyError(f"NRMS has no view {view!r}")
        return self.token_encoder.embed(ids)

    def head(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Word-level self-attention and additive attention over token states ``(B, L, E)``."""
        h = self.dropout(self.word_attn(self.dropout(states), mask))
        return self.word_pool(h, mask)

    def news_from_embeddings(self, embeds: dict[str, torch.Tensor], masks: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = masks["title"]
        return self.head(self.token_encoder(embeds["title"], mask), mask)

    @property
    def packable(self) -> bool:
        """Whether :meth:`news_from_packed` is available (the token encoder knows its position convention)."""
        return bool(getattr(self.token_encoder, "packable", False))

    @property
    def pack_pays(self) -> bool:
        """Whether packing is faster than padding on a CPU for this token encoder (see ``pack_pays`` there)."""
        return self.packable and bool(getattr(self.token_encoder, "pack_pays", False))

    def news_from_packed(self, embeds: torch.Tensor, positions: torch.Tensor, segments: torch.Tensor,
                         n_segments: int) -> torch.Tensor:
        """News vectors of titles packed several to a row (no padding between them): ``embeds`` ``(B, T, E)``
        title-view embeddings, ``positions`` ``(B, T)`` each token's position within its title, ``segments``
        ``(B, T)`` its title's index within the row (-1: padding at the row's end). Returns ``(B, n_segments, D)``.
        Attention never crosses titles, so every title's vector equals ``news_from_embeddings`` of that title alone
        (up to fp32 rounding); padding tokens attend only to themselves (finite, and never read)."""
        same = segments[:, :, None] == segments[:, None, :]
        block = (same & (segments[:, None, :] >= 0)) | torch.eye(segments.shape[1], dtype=torch.bool,
                                                                  device=segments.device)[None]
        states = self.token_encoder.forward_packed(embeds, positions, block)
        h = self.dropout(self.word_attn(self.dropout(states), block))
        return self.word_pool.pool_segments(h, segments, n_segments)

    def encode_news_packed(self, enc: dict[str, Encoded]) -> torch.Tensor:
        """``encode_news`` with the titles packed several to a row (at most twice the longest title's tokens), so
        padding costs nothing; equal to ``encode_news`` up to fp32 rounding."""
        e = enc["title"]
        dev = self.device
        ids, mask = e.ids.to(dev), e.mask.to(dev)
        x = self.embed("title", ids)
        lengths = mask.sum(1).tolist()
        layout = pack_rows(lengths, ids.shape[1], 2 * max(lengths), dev)
        flat = torch.cat([x.reshape(-1, x.shape[-1]), x.new_zeros(1, x.shape[-1])])
        news = self.news_from_packed(flat[layout.index], layout.positions, layout.segments, layout.n_segments)
        return news.reshape(-1, news.shape[-1])[layout.slot]

    def user_vector(self, news_vecs: torch.Tensor, hist_mask: torch.Tensor) -> torch.Tensor:
        h = self.dropout(self.user_attn(news_vecs, hist_mask))
        return self.user_pool(h, hist_mask)


class CNNView(nn.Module):
    """NAML view encoder: 1-D convolution over word embeddings, ReLU, additive-attention pooling."""

    def __init__(self, emb_dim: int, filters: int, window: int, query_dim: int, dropout: float):
        super().__init__()
        self.conv = nn.Conv1d(emb_dim, filters, window, padding=window // 2)
        self.pool = AdditiveAttention(filters, query_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(self.dropout(embeds).transpose(1, 2))).transpose(1, 2)
        return self.pool(self.dropout(h), mask)


class NAML(NewsRecommender):
    kind = "naml"
    views = ("title", "body")

    def __init__(self, tokenizer: WordTokenizer, config: dict[str, Any]):
        super().__init__()
        self.tokenizer = tokenizer
        self.config = config
        dim, filters, window, query_dim = config["emb_dim"], config["filters"], config["window"], config["query_dim"]
        dropout = config.get("dropout", 0.2)
        self.embedding = nn.Embedding(len(tokenizer.itos), dim, padding_idx=0)
        self.title_view = CNNView(dim, filters, window, query_dim, dropout)
        self.body_view = CNNView(dim, filters, window, query_dim, dropout)
        self.view_pool = AdditiveAttention(filters, query_dim)
        self.user_pool = AdditiveAttention(filters, query_dim)

    def embed(self, view: str, ids: torch.Tensor) -> torch.Tensor:
        if view not in self.views:
            raise KeyError(f"NAML has no view {view!r}")
        return self.embedding(ids)

    def news_from_embeddings(self, embeds: dict[str, torch.Tensor], masks: dict[str, torch.Tensor]) -> torch.Tensor:
        t = self.title_view(embeds["title"], masks["title"])
        b = self.body_view(embeds["body"], masks["body"])
        views = torch.stack([t, b], dim=1)  # (B, 2, F)
        return self.view_pool(views, torch.ones(views.shape[:2], device=views.device))

    def user_vector(self, news_vecs: torch.Tensor, hist_mask: torch.Tensor) -> torch.Tensor:
        return self.user_pool(news_vecs, hist_mask)


NRMS_DEFAULTS: dict[str, Any] = {
    "heads": 16, "head_dim": 16, "query_dim": 200, "dropout": 0.2, "max_title_len": 30, "emb_dim": 128,
}
NAML_DEFAULTS: dict[str, Any] = {
    "emb_dim": 128, "filters": 256, "window": 3, "query_dim": 200, "dropout": 0.2,
    "max_title_len": 30, "max_body_len": 60,
}


def _init_from_glove(embedding: nn.Embedding, path: str, tokenizer: WordTokenizer) -> None:
    """Initialise ``embedding`` from a GloVe text file (only when a model is first built: a checkpoint's weights
    replace it on load, so the file is not needed afterwards)."""
    if not Path(path).exists():
        return  # loading a trained checkpoint whose GloVe source is gone: the saved weights are what count
    table, _found = load_glove(path, tokenizer, embedding.embedding_dim)
    with torch.no_grad():
        embedding.weight.copy_(table)


def build_model(config: dict[str, Any], tokenizer: NewsTokenizer | None = None) -> NewsRecommender:
    """Build a model from its JSON config. ``config["encoder"]`` is ``bert`` or ``word`` for NRMS."""
    kind = config["kind"]
    if kind == "nrms":
        cfg = {**NRMS_DEFAULTS, **config}
        if cfg["encoder"] == "bert":
            encoder = BertTokenEncoder(cfg.get("pretrained", "minilm"), fine_tune=bool(cfg.get("fine_tune", False)),
                                       fine_tune_layers=cfg.get("fine_tune_layers"))
            tok = tokenizer or BertNewsTokenizer(resolve_pretrained(cfg.get("pretrained", "minilm")))
        elif cfg["encoder"] == "word":
            if not isinstance(tokenizer, WordTokenizer):
                raise ValueError("a word-embedding NRMS needs a WordTokenizer")
            tok = tokenizer
            encoder = WordEmbeddingEncoder(len(tok.itos), cfg["emb_dim"], cfg["dropout"])
            if cfg.get("glove"):
                _init_from_glove(encoder.embedding, cfg["glove"], tok)
        else:
            raise ValueError(f"unknown NRMS encoder {cfg['encoder']!r}")
        return NRMS(tok, encoder, cfg)
    if kind == "naml":
        if not isinstance(tokenizer, WordTokenizer):
            raise ValueError("NAML needs a WordTokenizer")
        model = NAML(tokenizer, {**NAML_DEFAULTS, **config})
        if config.get("glove"):
            _init_from_glove(model.embedding, config["glove"], tokenizer)
        return model
    raise ValueError(f"unknown model kind {kind!r}")
