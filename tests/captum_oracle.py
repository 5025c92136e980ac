"""Captum ``TracInCP`` set up on a ConvE bundle: the independent oracle for the tests and the benchmark.

Captum needs a module whose input is the examples and a per-example loss over its output, so ConvE is viewed as
triples -> logits of each query direction ``[B, Q, N]``, and the loss sums the per-query loss over directions.
Captum is a development dependency; it is imported only when this is called.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from models.kg.checkpoint import KGBundle
from models.kg.conve import query_loss, triple_queries


class TripleModel(nn.Module):
    """ConvE as a function of whole triples: ``[B, 3] -> [B, Q, N]`` logits, one slice per query direction."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, triples: torch.Tensor) -> torch.Tensor:
        c = self.model.config
        qs = triple_queries(triples, c.num_relations, c.reciprocal)
        return torch.stack([self.model(q[:, 0], q[:, 1]) for q in qs], 1)


class TripleLoss(nn.Module):
    """Per-example loss for Captum: the sum over query directions of ``query_loss`` (``train`` or ``score_bce``)."""

    reduction = "none"

    def __init__(self, model: nn.Module, kind: str = "train") -> None:
        super().__init__()
        self.cfg = model.config
        self.kind = kind

    def forward(self, out: torch.Tensor, triples: torch.Tensor) -> torch.Tensor:
        qs = triple_queries(triples, self.cfg.num_relations, self.cfg.reciprocal)
        return sum(query_loss(out[:, i], q[:, 2], self.cfg.label_smoothing, self.kind) for i, q in enumerate(qs))


def captum_tracincp(bundle: KGBundle, train: torch.Tensor, layers: list[str] | None = None, loss: str = "train",
                    batch_size: int = 16) -> Any:
    """A ``captum.influence.TracInCP`` over ``train`` with the bundle's checkpoints and learning rates.

    ``layers`` are Captum layer names on the wrapper (``model.fc``...); None means every parameter.
    """
    from captum.influence import TracInCP
    from safetensors.torch import load_file
    from torch.utils.data import DataLoader, TensorDataset

    wrapper = TripleModel(copy.deepcopy(bundle.model)).eval()
    lrs = {str(c.path): c.lr for c in bundle.checkpoints}

    def load_checkpoint(model: nn.Module, path: str) -> float:
        model.model.load_state_dict(load_file(path))
        model.eval()
        return lrs[path]

    loader = DataLoader(TensorDataset(train, train), batch_size=batch_size, shuffle=False)
    return TracInCP(wrapper, loader, [str(c.path) for c in bundle.checkpoints],
                    checkpoints_load_func=load_checkpoint, layers=layers, loss_fn=TripleLoss(wrapper.model, loss),
                    batch_size=batch_size, sample_wise_grads_per_batch=False)


def captum_layer_ig(clf: Any, text: str, target: int, baseline: str, n_steps: int,
                    method: str = "gausslegendre") -> tuple[torch.Tensor, float]:
    """Captum's ``LayerIntegratedGradients(forward, model.get_input_embeddings())`` of one text of a Hugging Face
    classifier (``models.hf.checkpoint.HFClassifier``), for class ``target``: the token attributions ``(L,)`` (summed
    over the embedding dimension, fp64) and their sum. ``forward`` takes the token ids (every position attended)
    and returns the logits; the baseline ids put the pad or mask token at every content position (structural tokens
    kept), so Captum takes the baseline embeddings from the same table. ``baseline`` ``zero`` has no token:
    Captum's ``IntegratedGradients`` over the word embeddings, passed as ``inputs_embeds``, attributes it."""
    from captum.attr import IntegratedGradients, LayerIntegratedGradients

    from models.news.text import structural_ids

    model, tok = clf.model, clf.tokenizer
    enc = tok(text, truncation=True, return_tensors="pt")
    ids = enc["input_ids"].to(clf.device)
    special = structural_ids(tok)
    word_ids = enc.word_ids(0)
    content = torch.tensor([[w is not None and int(t) not in special for t, w in zip(ids[0].tolist(), word_ids,
                                                                                   strict=True)]],
                           device=ids.device)

    def forward(input_ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits

    if baseline == "zero":
        with torch.no_grad():
            x = model.get_input_embeddings()(ids)

        def from_embeddings(e: torch.Tensor) -> torch.Tensor:
            mask = torch.ones(e.shape[:2], dtype=torch.long, device=e.device)
            return model(inputs_embeds=e, attention_mask=mask).logits

        base = torch.where(content[..., None], torch.zeros_like(x), x)
        attr = IntegratedGradients(from_embeddings).attribute(x, baselines=base, target=target, n_steps=n_steps,
                                                              method=method)
    else:
        token = tok.pad_token_id if baseline == "pad" else tok.mask_token_id
        base_ids = torch.where(content, torch.full_like(ids, token), ids)
        lig = LayerIntegratedGradients(forward, model.get_input_embeddings())
        attr = lig.attribute(ids, baselines=base_ids, target=target, n_steps=n_steps, method=method)
    tokens = attr[0].sum(-1).double().cpu()
    return tokens, float(tokens.sum())
