"""TracIn-CP for Hugging Face classifiers fine-tuned by the service, from the checkpoints ``models.hf.train``
wrote (``checkpoints.json``: ``checkpoints/epoch-<k>.safetensors`` and their learning rates).

The generic engine (:class:`models.explain.tracin.TracIn` over :class:`models.explain.tracin.FuncGradients`) runs
on :class:`TextModule`, the classifier as a module of token ids and attention mask. An example is one row
``[ids (L), mask (L), label]`` (:func:`rows`: the texts tokenized as the fine-tuning tokenized them, truncated to
``max_length`` and padded to the longest, L); its loss is the cross-entropy of the classifier's logits for the
label. Padding changes nothing: the attention mask keeps every padded position out of every real one (the padded
batch's equality with unpadded texts is tested for fine-tuning, ``tests/test_hf_train.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.explain.classifier import Classifier
from models.explain.gradients import classification_margin
from models.explain.tracin import CheckpointLike, MemoryCheckpoint
from models.hf.checkpoint import HFClassifier

CHECKPOINTS_FILE = "checkpoints.json"
CAUSAL = ("gpt2",)  # model types whose attention is causal (each token attends to the ones before it)


class TextModule(nn.Module):
    """A Hugging Face sequence classifier as ``forward(ids, mask) -> logits`` (its parameters under ``model.``)."""

    def __init__(self, clf: HFClassifier):
        super().__init__()
        self.model = clf.model
        self.causal = bool(getattr(clf.model.config, "is_decoder", False)) or clf.info.model_type in CAUSAL

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # the mask as the attention's own 4D additive form ([n, 1, L, L]: 0 where a query attends to a key, the
        # dtype's lowest value elsewhere), which transformers passes through as it is: its 2D-mask preparation
        # branches on the mask's values, which per-example gradients (vmap) cannot trace
        dtype = next(self.model.parameters()).dtype
        keep = mask[:, None, None, :].bool().expand(-1, 1, ids.shape[1], -1)
        if self.causal:
            keep = keep & torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool, device=ids.device).tril()
        additive = torch.zeros(keep.shape, dtype=dtype, device=ids.device).masked_fill(~keep, torch.finfo(dtype).min)
        return self.model(input_ids=ids, attention_mask=additive).logits


def width(clf: HFClassifier, texts: list[str], max_length: int) -> int:
    """The longest of ``texts`` in tokens, cut to ``max_length`` (the ``L`` of :func:`rows`)."""
    enc = clf.tokenizer(texts, truncation=True, max_length=max_length)
    return max((len(ids) for ids in enc["input_ids"]), default=1)


def rows(clf: HFClassifier, texts: list[str], labels: list[int], max_length: int, length: int) -> torch.Tensor:
    """``[N, 2L + 1]``: each text's token ids and attention mask (cut to ``max_length``, padded to ``length`` =
    L) and its class."""
    if len(texts) > 1 and clf.tokenizer.pad_token is None:
        raise ValueError("the tokenizer has no pad token, so texts cannot be held as rows; save the tokenizer with "
                         "one (tokenizer.pad_token = tokenizer.eos_token)")
    enc = clf.tokenizer.pad(clf.tokenizer(texts, truncation=True, max_length=max_length), padding="max_length",
                            max_length=length, return_tensors="pt")
    return torch.cat([enc["input_ids"].float(), enc["attention_mask"].float(),
                      torch.tensor(labels, dtype=torch.float32).reshape(-1, 1)], 1)


def _split(example: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's ``[1, L]`` ids and mask; L from the row's own length (``2L + 1``), so rows of any width work."""
    width = (example.shape[-1] - 1) // 2
    return example[:width].long().reshape(1, width), example[width:2 * width].long().reshape(1, width)


def loss_of(width: int | None = None) -> Callable[[Callable[..., Any], torch.Tensor], torch.Tensor]:
    """The per-example loss of a row (:data:`models.explain.gradients.LossFn`); its width is read from the row
    (``width``, the L the rows were built with, is not needed)."""

    def loss(forward: Callable[..., Any], example: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(forward(*_split(example)).float(), example[-1:].long())

    return loss


def margin_of(width: int | None = None) -> Callable[[Callable[..., Any], torch.Tensor], torch.Tensor]:
    """The per-example output TRAK differentiates (``classification_margin``), for a row of :func:`rows`."""

    def output(forward: Callable[..., Any], example: torch.Tensor) -> torch.Tensor:
        return classification_margin(forward(*_split(example)).float(), example[-1:].long())

    return output


def read_checkpoints(directory: Path, module: TextModule, which: str = "all") -> tuple[list[dict[str, Any]],
                                                                                        list[MemoryCheckpoint]]:
    """The listed checkpoints (``which``: ``all`` or ``last``) as states of ``module``; ValueError when none."""
    from safetensors.torch import load_file

    path = Path(directory) / CHECKPOINTS_FILE
    listed = json.loads(path.read_text()) if path.is_file() else []
    if not listed:
        raise ValueError("the model has no training checkpoints (fine-tune it with POST /train/classifier, which "
                         "keeps them)")
    if which == "last":
        listed = listed[-1:]
    current = module.state_dict(keep_vars=True)
    by_storage: dict[int, list[str]] = {}
    for k, v in current.items():
        by_storage.setdefault(v.data_ptr(), []).append(k)
    states = []
    for c in listed:
        tensors = {f"model.{k}": v for k, v in load_file(str(Path(directory) / c["file"])).items()}
        unknown = sorted(set(tensors) - set(current))
        if unknown:
            raise ValueError(f"checkpoint {c['file']} holds tensors the model does not have ({unknown[:4]})")
        state = {}
        for k, v in current.items():
            if k in tensors:
                state[k] = tensors[k]
                continue
            # a tensor the file leaves out shares its storage with one it holds (tied weights: saved once), or is a
            # buffer no checkpoint changes (the model's own)
            twin = next((t for t in by_storage[v.data_ptr()] if t in tensors), None)
            if twin is None and isinstance(v, nn.Parameter):
                raise ValueError(f"checkpoint {c['file']} lacks the parameter {k.removeprefix('model.')}")
            state[k] = tensors[twin] if twin is not None else v.detach().clone()
        states.append(MemoryCheckpoint(state, float(c["lr"]), f"epoch-{c['epoch']}"))
    return listed, states


def linear_layers(module: nn.Module) -> nn.Module:
    """``module`` (changed in place and returned) with every transformers ``Conv1D`` (GPT-2's projections:
    ``x @ W + b``, ``W`` ``[in, out]``) replaced by the ``nn.Linear`` of the same map (weight ``Wᵀ``), so that
    Kronfluence, which covers ``nn.Linear`` and ``nn.Conv2d``, covers them too. Other modules are kept."""
    from transformers.pytorch_utils import Conv1D

    for name, child in list(module.named_modules()):
        if not isinstance(child, Conv1D):
            continue
        w = child.weight.detach()
        linear = nn.Linear(w.shape[0], w.shape[1], bias=child.bias is not None).to(device=w.device, dtype=w.dtype)
        with torch.no_grad():
            linear.weight.copy_(w.t())
            if child.bias is not None:
                linear.bias.copy_(child.bias.detach())
        parent, _, leaf = name.rpartition(".")
        setattr(module.get_submodule(parent) if parent else module, leaf, linear)
    return module


def classifier(module: TextModule, checkpoints: Sequence[CheckpointLike], name: str = "classifier") -> Classifier:
    """The text classifier as the estimators take it (:class:`models.explain.classifier.Classifier`): rows of
    :func:`rows` of any width (each batch's width is read from it), its checkpoints, EK-FAC over its ``nn.Linear`` layers (``Conv1D`` as
    ``nn.Linear``, :func:`linear_layers`), the rows' attention masks keeping padding out of Kronfluence's
    covariances."""

    def inputs(r: torch.Tensor) -> tuple[torch.Tensor, ...]:
        width = (r.shape[1] - 1) // 2
        return r[:, :width].long(), r[:, width:2 * width].long()

    return Classifier(
        module=module, checkpoints=list(checkpoints), loss=loss_of(), margin=margin_of(), inputs=inputs,
        labels=lambda r: r[:, -1].long(), layered=linear_layers, token_mask=lambda r: inputs(r)[1], name=name,
        config={"format": "huggingface", "config": json.loads(module.model.config.to_json_string(use_diff=True))})
