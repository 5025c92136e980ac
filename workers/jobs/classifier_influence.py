"""Worker side of ``POST /tracin/classifier``: TracIn-CP on a trained classifier's checkpoints
(``models.export.influence`` for exported programs, ``models.hf.influence`` for Hugging Face classifiers, both over
the generic engine ``models.explain.tracin``), mode ``test`` (a streaming top-k of proponents and opponents per
test example) or ``self`` (every training example's self-influence, ranked).

Artifacts: ``influence.csv`` (mode test: every listed pair) and ``self_influence.csv`` (mode self: every training
example, highest first, with its label and the model's prediction).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from core import dataset_refs, registry
from core.contract.results.classifier_influence import TEXT_SHOWN
from core.kinds.classifier_influence import (
    ClassifierInfluenceRequest,
    ClassifierInfluenceResult,
    chunk_size,
    training_dataset,
)
from core.kinds.train_classifier import DATASET_KINDS, HF_KIND
from core.userfiles import files_for
from models.tables import TableWriter
from workers.context import JobContext, JobError


def _class_index(target: int | str | None, labels: list[str]) -> int | None:
    if target is None:
        return None
    return target if isinstance(target, int) else labels.index(target)


@dataclass
class Prepared:
    """What the engine runs on: the module and its loss, the checkpoints, the training examples as rows with their
    labels (and texts), the test examples as rows with ids, targets, predictions and known labels."""

    module: Any
    loss: Any
    listed: list[dict[str, Any]]
    states: list[Any]
    labels: list[str]
    train_rows: Any
    train_labels: list[int]
    train_predicted: Any  # a callable: the model's predicted class of every training example (mode self)
    train_texts: list[str] | None = None
    train_preview: Any = None  # a callable: an image training example's preview (exported image models)
    test_rows: Any = None
    test_texts: list[str] | None = None
    test_previews: list[Any] | None = None
    test_ids: list[str] | None = None
    targets: list[int] | None = None
    predicted: list[int] | None = None
    known: list[str | None] | None = None


def _exported(r: ClassifierInfluenceRequest, ctx: JobContext, source: Any, directory: Any, name: str) -> Prepared:
    import torch

    from models.export.influence import ProgramModule, loss_of, preview, read_checkpoints, rows
    from models.export.program import load
    from models.export.train import read_split

    files = files_for(ctx.settings, directory)
    try:
        train = read_split(directory / "train.safetensors", files)
        tests = read_split(directory / f"{r.test_split}.safetensors", files) if r.test_indices else None
    except (ValueError, OSError) as exc:
        raise JobError("bad_dataset", f"dataset {name!r}: {exc}") from None
    try:
        clf = load(source, ctx.device)
        module = ProgramModule(clf)
        ckpts = read_checkpoints(source, module, r.checkpoints, ctx.device)
    except (ValueError, OSError) as exc:
        raise JobError("invalid_model", str(exc)) from None
    labels, shape = clf.labels, tuple(clf.spec.shape)
    if list(train.inputs.shape[1:]) != list(shape):
        raise JobError("invalid_request", f"dataset {name!r} has inputs of shape {list(train.inputs.shape[1:])}; "
                       f"model {r.model!r} takes {list(shape)}")
    out = Prepared(module, loss_of(shape), ckpts.listed, ckpts.states, labels, rows(train.inputs, train.labels),
                   train.labels.tolist(), lambda: clf.logits(train.inputs).argmax(1).tolist())
    image = clf.spec.kind == "image"
    if image:
        out.train_preview = lambda j: preview(train.inputs[j])
    if r.mode == "self":
        return out
    if r.inputs is not None:
        x = torch.tensor([t.values for t in r.inputs], dtype=torch.float32).reshape(len(r.inputs), *shape)
        out.test_ids = [t.id for t in r.inputs]
        given = [_class_index(t.target, labels) for t in r.inputs]
        out.known = [t.label for t in r.inputs]
    else:
        assert tests is not None and r.test_indices is not None
        x = tests.inputs[r.test_indices]
        out.test_ids = [f"{r.test_split}[{k}]" for k in r.test_indices]
        given = [int(tests.labels[k]) for k in r.test_indices]
        out.known = [labels[g] for g in given]
    out.predicted = clf.logits(x.to(ctx.device)).argmax(1).cpu().tolist()
    out.targets = [g if g is not None else p for g, p in zip(given, out.predicted, strict=True)]
    out.test_rows = rows(x, torch.tensor(out.targets))
    if image:
        out.test_previews = [preview(t) for t in x]
    return out


def _huggingface(r: ClassifierInfluenceRequest, ctx: JobContext, source: Any, directory: Any, name: str) -> Prepared:
    from models.hf.checkpoint import load
    from models.hf.influence import TextModule, loss_of, read_checkpoints, rows, width
    from models.textdata import label_indices, read_split, split_files

    files = files_for(ctx.settings, directory)
    found = split_files(directory)
    try:
        train = read_split(found["train"], files)
        tests = read_split(found[r.test_split], files) if r.test_indices else None
    except KeyError:
        raise JobError("bad_dataset", f"dataset {name!r} has no {r.test_split} split") from None
    except (ValueError, OSError) as exc:
        raise JobError("bad_dataset", f"dataset {name!r}: {exc}") from None
    try:
        clf = load(source, ctx.device)
        module = TextModule(clf)
        listed, states = read_checkpoints(source, module, r.checkpoints)
    except (ValueError, OSError) as exc:
        raise JobError("invalid_model", str(exc)) from None
    labels = clf.labels
    train_labels, bad = label_indices(train.labels, labels)
    if train_labels is None:
        raise JobError("bad_dataset", f"dataset {name!r}: the labels {bad} are not classes of model {r.model!r}")
    texts: list[str] = []
    given: list[int | None] = []
    if r.mode == "test":
        if r.texts is not None:
            texts = [t.text for t in r.texts]
            given = [_class_index(t.target, labels) for t in r.texts]
            known = [t.label for t in r.texts]
            ids = [t.id for t in r.texts]
        else:
            assert tests is not None and r.test_indices is not None
            idx, bad = label_indices([tests.labels[k] for k in r.test_indices], labels)
            if idx is None:
                raise JobError("bad_dataset", f"dataset {name!r}: the labels {bad} are not classes of model "
                               f"{r.model!r}")
            texts = [tests.texts[k] for k in r.test_indices]
            given = list(idx)
            known = [labels[g] for g in idx]
            ids = [f"{r.test_split}[{k}]" for k in r.test_indices]
    try:
        length = width(clf, train.texts + texts, r.max_length)
        train_rows = rows(clf, train.texts, train_labels, r.max_length, length)
    except ValueError as exc:
        raise JobError("invalid_request", str(exc)) from None
    out = Prepared(module, loss_of(length), listed, states, labels, train_rows, train_labels,
                   lambda: clf.logits(train.texts).argmax(1).tolist(), train_texts=train.texts)
    if r.mode == "self":
        return out
    out.test_ids, out.known, out.test_texts = ids, known, [t[:TEXT_SHOWN] for t in texts]
    out.predicted = clf.logits(texts).argmax(1).tolist()
    out.targets = [g if g is not None else p for g, p in zip(given, out.predicted, strict=True)]
    out.test_rows = rows(clf, texts, out.targets, r.max_length, length)
    return out


def run(request: ClassifierInfluenceRequest, ctx: JobContext) -> ClassifierInfluenceResult:
    import torch

    from models.explain.tracin import FuncGradients, TracIn

    t0 = time.perf_counter()
    r = request
    entry = registry.get_model(ctx.settings, r.model)
    if entry is None or entry.get("kind") not in DATASET_KINDS:
        raise JobError("unknown_model", f"model {r.model!r} is not a registered exported or Hugging Face classifier")
    kind = entry["kind"]
    source = registry.local_path(ctx.settings, entry)
    name = training_dataset(r, entry)
    ref = dataset_refs.resolve(ctx.settings, name, ctx.owner, DATASET_KINDS[kind])
    directory = registry.absolute_path(ctx.settings, ref.entry) if ref.entry is not None else ref.path
    p = (_huggingface if kind == HF_KIND else _exported)(r, ctx, source, directory, name)
    parameters = sum(t.numel() for t in p.module.parameters())
    engine = TracIn(FuncGradients(p.module, p.loss, device=ctx.device), p.states,
                    batch_size=chunk_size(r, parameters))
    labels = p.labels

    def progress(done: int, total: int) -> None:
        ctx.progress(done, total, "chunks", message=f"{done}/{total} checkpoint x chunk passes")

    def example(j: int, score: float, self_influence: float | None = None) -> dict[str, Any]:
        out = {"index": j, "label": labels[p.train_labels[j]], "score": score, "self_influence": self_influence}
        if p.train_texts is not None:
            out["text"] = p.train_texts[j][:TEXT_SHOWN]
        if p.train_preview is not None:
            out["preview"] = p.train_preview(j)
        return out

    base: dict[str, Any] = {"model": r.model, "dataset": name, "mode": r.mode, "parameters": parameters,
                            "train_examples": len(p.train_rows), "checkpoints": p.listed, "labels": labels}
    if r.mode == "self":
        scores = engine.self_influence(p.train_rows, progress).float().cpu()
        predicted = p.train_predicted()
        order = torch.argsort(scores, descending=True, stable=True).tolist()
        with open(ctx.artifact_path("self_influence.csv"), "w", newline="", encoding="utf-8") as fh:
            TableWriter(fh, ["rank", "index", "label", "predicted", "self_influence"]).rows(
                [rank, i, labels[p.train_labels[i]], labels[predicted[i]], float(scores[i])]
                for rank, i in enumerate(order, 1))
        return ClassifierInfluenceResult.model_validate({
            **base, "self_influence": [example(i, float(scores[i])) for i in order[:r.top_k]],
            "seconds": time.perf_counter() - t0, "artifacts": ctx.artifacts()})

    assert p.test_ids is not None and p.targets is not None and p.predicted is not None and p.known is not None
    top = engine.top_influence(p.test_rows, p.train_rows, r.top_k, progress=progress)
    tests, pairs = [], []
    for i, test_id in enumerate(p.test_ids):
        lists = {}
        for key, positive in (("proponents", True), ("opponents", False)):
            lists[key] = [example(j, v, s) for j, v, s in top.listed(i, positive)]
            pairs.extend([test_id, key[:-1], rank, e["index"], e["label"], e["score"]]
                         for rank, e in enumerate(lists[key], 1))
        tests.append({"id": test_id, "target": labels[p.targets[i]], "predicted": labels[p.predicted[i]],
                      "label": p.known[i], "self_influence": float(top.test_self[i]),
                      "n_positive": int(top.n_positive[i]), "n_negative": int(top.n_negative[i]), **lists,
                      "text": p.test_texts[i] if p.test_texts is not None else None,
                      "preview": p.test_previews[i] if p.test_previews is not None else None})
    with open(ctx.artifact_path("influence.csv"), "w", newline="", encoding="utf-8") as fh:
        TableWriter(fh, ["test", "side", "rank", "index", "label", "influence"]).rows(pairs)
    return ClassifierInfluenceResult.model_validate({
        **base, "tests": tests, "seconds": time.perf_counter() - t0, "artifacts": ctx.artifacts()})
