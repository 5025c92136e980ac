"""ConvE (Dettmers et al. 2018, "Convolutional 2D Knowledge Graph Embeddings").

For a query (h, r) with embeddings e_h, e_r ∈ R^d, each reshaped to an ``H × W`` image (d = H·W) and stacked
into a ``2H × W`` image:

    z0 = BN0(drop_in([ē_h; ē_r]))
    c  = conv_{k×k, F filters}(z0)
    a  = drop_feat(ReLU(BN1(c))) flattened          (F · (2H-k+1) · (W-k+1) features)
    x  = ReLU(BN2(drop_hid(W_fc a + b_fc)))        ∈ R^d
    s  = x Eᵀ + b_ent                              scores against every entity

The training loss of one query is 1-N BCE with label smoothing, averaged over the N entities:

    ℓ = (1/N) Σ_e BCE(σ(s_e), y_e),  y = (1 − ε) · onehot(t) + 1/N

With ``reciprocal`` relations (the usual ConvE set-up) every triple (h, r, t) also trains the query
(t, r⁻¹, h), where r⁻¹ = r + R has its own embedding; head prediction is then tail prediction on r⁻¹.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.kg.shapes import default_height  # noqa: F401  (re-exported)


@dataclass
class ConvEConfig:
    num_entities: int
    num_relations: int  # base relations; the model holds 2x when reciprocal
    embedding_dim: int = 200
    embedding_height: int = 10  # each embedding is reshaped to height x (dim / height)
    num_filters: int = 32
    kernel_size: int = 3
    input_dropout: float = 0.2
    feature_dropout: float = 0.2
    hidden_dropout: float = 0.3
    label_smoothing: float = 0.1
    reciprocal: bool = True

    def __post_init__(self) -> None:
        if self.embedding_dim % self.embedding_height:
            raise ValueError(f"embedding_dim {self.embedding_dim} is not a multiple of embedding_height "
                             f"{self.embedding_height}")
        if self.embedding_width < self.kernel_size or 2 * self.embedding_height < self.kernel_size:
            raise ValueError("embedding image smaller than the convolution kernel")

    @property
    def embedding_width(self) -> int:
        return self.embedding_dim // self.embedding_height

    @property
    def num_relation_embeddings(self) -> int:
        return 2 * self.num_relations if self.reciprocal else self.num_relations

    @property
    def conv_out_shape(self) -> tuple[int, int]:
        k = self.kernel_size
        return 2 * self.embedding_height - k + 1, self.embedding_width - k + 1

    @property
    def flat_dim(self) -> int:
        oh, ow = self.conv_out_shape
        return self.num_filters * oh * ow

    def to_dict(self) -> dict:
        return asdict(self)


class ConvE(nn.Module):
    """ConvE scoring (h, r) queries against all entities. Parameter names are part of the TracIn API."""

    def __init__(self, config: ConvEConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.ent = nn.Embedding(c.num_entities, c.embedding_dim)
        self.rel = nn.Embedding(c.num_relation_embeddings, c.embedding_dim)
        self.inp_drop = nn.Dropout(c.input_dropout)
        self.bn0 = nn.BatchNorm2d(1)
        self.conv = nn.Conv2d(1, c.num_filters, c.kernel_size, bias=True)
        self.bn1 = nn.BatchNorm2d(c.num_filters)
        self.feat_drop = nn.Dropout(c.feature_dropout)
        self.fc = nn.Linear(c.flat_dim, c.embedding_dim)
        self.hid_drop = nn.Dropout(c.hidden_dropout)
        self.bn2 = nn.BatchNorm1d(c.embedding_dim)
        self.ent_bias = nn.Parameter(torch.zeros(c.num_entities))
        nn.init.xavier_normal_(self.ent.weight)
        nn.init.xavier_normal_(self.rel.weight)

    def stack(self, e: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        c = self.config
        return torch.cat([e.view(-1, 1, c.embedding_height, c.embedding_width),
                          r.view(-1, 1, c.embedding_height, c.embedding_width)], 2)

    def encode(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """Query vectors x ∈ R^{B×d} for head ids ``h`` and relation ids ``r``."""
        x = self.stack(self.ent(h), self.rel(r))
        x = self.bn0(self.inp_drop(x))
        x = F.relu(self.bn1(self.conv(x)))
        x = self.feat_drop(x).flatten(1)
        x = self.bn2(self.hid_drop(self.fc(x)))
        return F.relu(x)

    def forward(self, h: torch.Tensor, r: torch.Tensor, out_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, N]`` against all entities.

        ``out_weight`` replaces the entity table in its output role only (the input lookup keeps ``ent.weight``);
        it lets the TracIn oracle take gradients of the output use alone (``layers="last"``).
        """
        table = self.ent.weight if out_weight is None else out_weight
        return self.encode(h, r) @ table.t() + self.ent_bias


def query_loss(logits: torch.Tensor, t: torch.Tensor, label_smoothing: float, kind: str = "train") -> torch.Tensor:
    """Per-query loss ``[B]`` in fp32.

    ``train``: the training loss, 1-N BCE with label smoothing averaged over entities.
    ``score_bce``: BCE of the single score σ(s_t) against 1 (the variant some TracIn tools used).
    ``margin``: the negated multi-class margin −(s_t − logsumexp_{e≠t} s_e), the output an LDS evaluation measures
    (negated so that, as for a loss, lower is better).
    """
    logits = logits.float()
    if kind == "train":
        n = logits.shape[-1]
        onehot = (torch.arange(n, device=logits.device) == t.unsqueeze(-1)).to(logits.dtype)  # vmap-friendly
        y = (1.0 - label_smoothing) * onehot + 1.0 / n
        return F.binary_cross_entropy_with_logits(logits, y, reduction="none").mean(-1)
    if kind == "score_bce":
        s = logits.gather(-1, t.unsqueeze(-1)).squeeze(-1)
        return F.binary_cross_entropy_with_logits(s, torch.ones_like(s), reduction="none")
    if kind == "margin":
        s = logits.gather(-1, t.unsqueeze(-1)).squeeze(-1)
        return torch.logsumexp(logits.scatter(-1, t.unsqueeze(-1), float("-inf")), -1) - s
    raise ValueError(f"loss must be 'train', 'score_bce' or 'margin', got {kind!r}")


def triple_queries(triples: torch.Tensor, num_relations: int, reciprocal: bool) -> list[torch.Tensor]:
    """The queries ``[(h, r, t)]`` a triple trains: itself, and (t, r + R, h) when reciprocal."""
    qs = [triples]
    if reciprocal:
        inv = torch.stack([triples[:, 2], triples[:, 1] + num_relations, triples[:, 0]], 1)
        qs.append(inv)
    return qs


def triple_loss(model: ConvE, triples: torch.Tensor, kind: str = "train",
                out_weight: torch.Tensor | None = None) -> torch.Tensor:
    """ℓ(w, z) per triple ``[B]``: the sum of its queries' losses (both directions when reciprocal)."""
    c = model.config
    total = None
    for q in triple_queries(triples, c.num_relations, c.reciprocal):
        loss = query_loss(model(q[:, 0], q[:, 1], out_weight), q[:, 2], c.label_smoothing, kind)
        total = loss if total is None else total + loss
    assert total is not None
    return total
