"""What a Hugging Face checkpoint directory must be before anything loads it (no torch: the API checks it).

A checkpoint is taken only as data: ``config.json`` (a JSON object naming a model type transformers builds from
its config, and that type's sequence-classification class as its architecture), ``model.safetensors`` (or its
shards with ``model.safetensors.index.json``) and a fast tokenizer (``tokenizer.json``). Everything that could run
code is refused with the reason and the way out:

- ``auto_map`` in ``config.json`` or ``tokenizer_config.json`` names Python code shipped with the checkpoint
  (``trust_remote_code``), which the service never runs;
- weights only in a pickle format (``pytorch_model.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``, ``*.pkl``) would be
  unpickled; ``model.save_pretrained(dir, safe_serialization=True)`` writes safetensors instead. A pickle next to
  safetensors weights is ignored: it is never opened, and never copied (:func:`checkpoint_files`).

Each file is read through a :class:`models.files.FileAccess` (in the service: inside the data roots, bounded), JSON
files at most :data:`MAX_JSON_BYTES`, and each safetensors header as JSON only
(:func:`models.lora.keys.read_safetensors_header`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.files import LOCAL, FileAccess
from models.lora.keys import DatasetFormatError, read_safetensors_header

# config.json's model_type -> the class AutoModelForSequenceClassification builds for it from the config alone
# (transformers' MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, for the families the service supports)
CLASSIFIERS = {
    "albert": "AlbertForSequenceClassification",
    "bert": "BertForSequenceClassification",
    "camembert": "CamembertForSequenceClassification",
    "deberta": "DebertaForSequenceClassification",
    "deberta-v2": "DebertaV2ForSequenceClassification",
    "distilbert": "DistilBertForSequenceClassification",
    "electra": "ElectraForSequenceClassification",
    "gpt2": "GPT2ForSequenceClassification",
    "mpnet": "MPNetForSequenceClassification",
    "roberta": "RobertaForSequenceClassification",
    "xlm-roberta": "XLMRobertaForSequenceClassification",
}
MODEL_TYPES = tuple(CLASSIFIERS)
TASKS = {"ForSequenceClassification": "sequence_classification"}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
CONVERT = ("load it with transformers where you trust it and save it with "
           "model.save_pretrained(directory, safe_serialization=True), which writes model.safetensors")
# The files a checkpoint is loaded from (data only: JSON and safetensors); everything else in the directory is left
# where it is. The weights are added by name (model.safetensors, or the index and its shards).
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json")  # copied when present
INDEX = "model.safetensors.index.json"
MAX_SHARDS = 64
MAX_LABELS = 10_000
MAX_JSON_BYTES = 1 << 20


class CheckpointError(ValueError):
    """A Hugging Face checkpoint directory the service will not load, with the reason and what to do."""


@dataclass
class CheckpointInfo:
    """What a checkpoint directory holds, read as data."""

    model_type: str
    architecture: str
    task: str
    labels: list[str]
    weights: list[str]                      # the safetensors files, in order
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)  # every tensor's shape, from the headers
    files: list[str] = field(default_factory=list)  # what loading reads (checkpoint_files)

    @property
    def parameters(self) -> int:
        total = 0
        for shape in self.tensors.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total


def _json(directory: Path, name: str, files: FileAccess) -> Any:
    try:
        with files.open(directory / name, "json") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(f"{name} cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise CheckpointError(f"{name} is over {MAX_JSON_BYTES} bytes: not a checkpoint's configuration")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise CheckpointError(f"{name} is not JSON") from None


def _refuse_remote_code(config: dict[str, Any], name: str) -> None:
    if "auto_map" in config:
        raise CheckpointError(f"{name} names code shipped with the checkpoint (auto_map: trust_remote_code), which "
                              "the service never runs; use a model class transformers has, and "
                              + CONVERT.replace("load it", "load the model"))


def _labels(config: dict[str, Any]) -> list[str]:
    id2label = config.get("id2label")
    n = config.get("num_labels")
    if isinstance(id2label, dict) and id2label:
        if len(id2label) > MAX_LABELS:
            raise CheckpointError(f"config.json has {len(id2label)} labels, more than {MAX_LABELS}")
        try:
            ordered = sorted((int(k), str(v)) for k, v in id2label.items())
        except (TypeError, ValueError):
            raise CheckpointError("config.json's id2label keys must be class indices") from None
        if [k for k, _ in ordered] != list(range(len(ordered))):
            raise CheckpointError("config.json's id2label must name classes 0, 1, ..., n - 1")
        return [v for _, v in ordered]
    if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_LABELS:
        return [f"LABEL_{i}" for i in range(n)]
    return ["LABEL_0", "LABEL_1"]  # transformers' default num_labels


def _architecture(config: dict[str, Any], model_type: str) -> tuple[str, str]:
    """The architecture config.json names and its task: the class transformers builds for ``model_type``."""
    expected = CLASSIFIERS[model_type]
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    task = next((t for suffix, t in TASKS.items() if arch.endswith(suffix)), None)
    if task is None:
        raise CheckpointError(f"config.json's architecture {arch[:120] or '(none)'!r} is not a sequence classifier; "
                              f"a {model_type} classifier is {expected} (save it with model.save_pretrained)")
    if arch != expected:
        raise CheckpointError(f"config.json's architecture {arch[:120]!r} is not the classifier transformers builds "
                              f"for model_type {model_type!r} ({expected})")
    return arch, task


def _weights(directory: Path, names: set[str], files: FileAccess) -> list[str]:
    if "model.safetensors" in names:
        return ["model.safetensors"]
    if INDEX in names:
        index = _json(directory, INDEX, files)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        values = list(weight_map.values()) if isinstance(weight_map, dict) else []
        shards = sorted(set(values)) if all(isinstance(v, str) for v in values) else []
        if not shards or len(shards) > MAX_SHARDS or any(
                "/" in s or "\\" in s or not s.endswith(".safetensors") or s not in names for s in shards):
            raise CheckpointError(f"{INDEX} must map the tensors to at most {MAX_SHARDS} .safetensors files of "
                                  "this directory")
        return shards
    pickles = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise CheckpointError(f"the weights are a pickle ({', '.join(pickles[:3])}), which loading would execute; "
                              + CONVERT)
    raise CheckpointError("no model.safetensors (or model.safetensors.index.json and its shards) in the directory; "
                          "save the model with model.save_pretrained(directory, safe_serialization=True)")


def checkpoint_files(weights: list[str], names: set[str]) -> list[str]:
    """The files of the directory that loading reads: config.json, the safetensors weights (and their index),
    tokenizer.json, and tokenizer_config.json / special_tokens_map.json where present. Never a pickle."""
    out = [CONFIG, *weights, TOKENIZER, *(n for n in TOKENIZER_FILES if n in names)]
    if len(weights) > 1 or weights[0] != "model.safetensors":
        out.insert(1, INDEX)
    return out


def inspect_checkpoint(directory: Path, files: FileAccess = LOCAL, names: set[str] | None = None) -> CheckpointInfo:
    """The checkpoint in ``directory`` read as data, or :class:`CheckpointError` saying why it is refused.
    ``names``: the regular files of the directory (default: listed here)."""
    directory = Path(directory)
    if names is None:
        names = {p.name for p in directory.iterdir() if p.is_file()}
    if CONFIG not in names:
        raise CheckpointError("no config.json: a Hugging Face checkpoint has one (save the model with "
                              "model.save_pretrained(directory, safe_serialization=True))")
    config = _json(directory, CONFIG, files)
    if not isinstance(config, dict):
        raise CheckpointError("config.json must be a JSON object")
    _refuse_remote_code(config, CONFIG)
    if "tokenizer_config.json" in names:
        tok = _json(directory, "tokenizer_config.json", files)
        if isinstance(tok, dict):
            _refuse_remote_code(tok, "tokenizer_config.json")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CLASSIFIERS:
        shown = repr(model_type[:64]) if isinstance(model_type, str) else "(none)"
        raise CheckpointError(f"config.json's model_type {shown} is not one the service builds from its config; "
                              f"choose a checkpoint of {', '.join(MODEL_TYPES)}")
    arch, task = _architecture(config, model_type)
    if TOKENIZER not in names:
        raise CheckpointError("no tokenizer.json: save the fast tokenizer with the model "
                              "(tokenizer.save_pretrained(directory))")
    weights = _weights(directory, names, files)
    tensors: dict[str, tuple[int, ...]] = {}
    for name in weights:
        try:
            table = read_safetensors_header(directory / name, files)
        except DatasetFormatError as exc:
            raise CheckpointError(f"{exc}; save the model again with model.save_pretrained(directory, "
                                  "safe_serialization=True)") from None
        except OSError as exc:
            raise CheckpointError(f"{name} cannot be read ({exc.strerror or exc})") from None
        tensors.update({k: tuple(int(d) for d in v["shape"]) for k, v in table.items()})
    if not tensors:
        raise CheckpointError("the safetensors files hold no tensors")
    return CheckpointInfo(model_type, arch, task, _labels(config), weights, tensors,
                          checkpoint_files(weights, names))
