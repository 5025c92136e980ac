"""Worker side of ``POST /tracin/classifier``: TracIn-CP on an exported classifier's checkpoints
(``models.export.influence`` over the generic engine ``models.explain.tracin``), mode ``test`` (a streaming top-k of
proponents and opponents per test example) or ``self`` (every training example's self-influence, ranked).

Artifacts: ``influence.csv`` (mode test: every listed pair) and ``self_influence.csv`` (mode self: every training
example, highest first, with its label and the model's prediction).
"""

from __future__ import annotations

import csv
import time
from typing import Any

from core import dataset_refs, registry
from core.kinds.classifier_influence import (
    ClassifierInfluenceRequest,
    ClassifierInfluenceResult,
    training_dataset,
)
from core.kinds.train_classifier import DATASET_KIND
from core.userfiles import files_for
from workers.context import JobContext, JobError


def _class_index(target: int | str | None, labels: list[str]) -> int | None:
    if target is None:
        return None
    return target if isinstance(target, int) else labels.index(target)


def run(request: ClassifierInfluenceRequest, ctx: JobContext) -> ClassifierInfluenceResult:
    import torch

    from models.explain.tracin import FuncGradients, TracIn
    from models.export.influence import ProgramModule, loss_of, read_checkpoints, rows
    from models.export.program import load
    from models.export.train import read_split

    t0 = time.perf_counter()
    r = request
    entry = registry.get_model(ctx.settings, r.model)
    if entry is None:
        raise JobError("unknown_model", f"model {r.model!r} is not registered")
    source = registry.local_path(ctx.settings, entry)
    name = training_dataset(r, entry)
    ref = dataset_refs.resolve(ctx.settings, name, ctx.owner, DATASET_KIND)
    directory = registry.absolute_path(ctx.settings, ref.entry) if ref.entry is not None else ref.path
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
    labels = clf.labels
    shape = tuple(clf.spec.shape)
    if list(train.inputs.shape[1:]) != list(shape):
        raise JobError("invalid_request", f"dataset {name!r} has inputs of shape {list(train.inputs.shape[1:])}; "
                       f"model {r.model!r} takes {list(shape)}")
    engine = TracIn(FuncGradients(module, loss_of(shape), device=ctx.device), ckpts.states, batch_size=r.batch_size)
    train_rows = rows(train.inputs, train.labels)

    def progress(done: int, total: int) -> None:
        ctx.progress(done, total, "chunks", message=f"{done}/{total} checkpoint x chunk passes")

    base: dict[str, Any] = {
        "model": r.model, "dataset": name, "mode": r.mode, "parameters": sum(p.numel() for p in module.parameters()),
        "train_examples": len(train_rows), "checkpoints": ckpts.listed, "labels": labels}
    if r.mode == "self":
        scores = engine.self_influence(train_rows, progress).float().cpu()
        predicted = clf.logits(train.inputs).argmax(1)
        order = torch.argsort(scores, descending=True, stable=True)
        path = ctx.artifact_path("self_influence.csv")
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["rank", "index", "label", "predicted", "self_influence"])
            for rank, i in enumerate(order.tolist(), 1):
                w.writerow([rank, i, labels[int(train.labels[i])], labels[int(predicted[i])], float(scores[i])])
        listed = [{"index": int(i), "label": labels[int(train.labels[i])], "score": float(scores[i])}
                  for i in order[:r.top_k].tolist()]
        return ClassifierInfluenceResult.model_validate({
            **base, "self_influence": listed, "seconds": time.perf_counter() - t0, "artifacts": ctx.artifacts()})

    if r.inputs is not None:
        x = torch.tensor([t.values for t in r.inputs], dtype=torch.float32).reshape(len(r.inputs), *shape)
        ids = [t.id for t in r.inputs]
        given = [_class_index(t.target, labels) for t in r.inputs]
        known = [t.label for t in r.inputs]
    else:
        assert tests is not None and r.test_indices is not None
        x = tests.inputs[r.test_indices]
        ids = [f"{r.test_split}[{k}]" for k in r.test_indices]
        given = [int(tests.labels[k]) for k in r.test_indices]
        known = [labels[g] for g in given]
    predicted = clf.logits(x.to(ctx.device)).argmax(1).cpu()
    targets = torch.tensor([g if g is not None else int(p) for g, p in zip(given, predicted.tolist(), strict=True)])
    top = engine.top_influence(rows(x, targets), train_rows, r.top_k, progress=progress)
    out, pairs = [], []
    for i, test_id in enumerate(ids):
        entry_lists = {}
        for key, positive in (("proponents", True), ("opponents", False)):
            entry_lists[key] = [{"index": j, "label": labels[int(train.labels[j])], "score": v, "self_influence": s}
                                for j, v, s in top.listed(i, positive)]
            pairs.extend([test_id, key[:-1], rank, e["index"], e["label"], e["score"]]
                         for rank, e in enumerate(entry_lists[key], 1))
        out.append({"id": test_id, "target": labels[int(targets[i])], "predicted": labels[int(predicted[i])],
                    "label": known[i], "self_influence": float(top.test_self[i]),
                    "n_positive": int(top.n_positive[i]), "n_negative": int(top.n_negative[i]), **entry_lists})
    with open(ctx.artifact_path("influence.csv"), "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["test", "side", "rank", "index", "label", "influence"])
        w.writerows(pairs)
    return ClassifierInfluenceResult.model_validate({
        **base, "tests": out, "seconds": time.perf_counter() - t0, "artifacts": ctx.artifacts()})
