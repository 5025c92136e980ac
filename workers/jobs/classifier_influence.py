"""Worker side of ``POST /tracin/classifier``: TracIn-CP or TRAK on a trained classifier's checkpoints
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
    output_of,
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
    output: Any  # TRAK's output function (the classification margin)
    listed: list[dict[str, Any]]
    states: list[Any]
    labels: list[str]
    train_rows: Any
    train_labels: list[int]
    train_logits: Any  # a callable: the final model's logits of every training example [n, classes]
    train_texts: list[str] | None = None
    train_preview: Any = None  # a callable: an image training example's preview (exported image models)
    test_rows: Any = None
    test_texts: list[str] | None = None
    test_previews: list[Any] | None = None
    test_ids: list[str] | None = None
    targets: list[int] | None = None
    predicted: list[int] | None = None
    known: list[str | None] | None = None
    clf: Any = None        # models.explain.classifier.Classifier: what every estimator takes
    member: Any = None     # a callable: (source directory, model name) -> that ensemble member's Classifier


def _exported(r: ClassifierInfluenceRequest, ctx: JobContext, source: Any, directory: Any, name: str) -> Prepared:
    import torch

    from models.export.influence import (
        ProgramModule,
        classifier,
        loss_of,
        margin_of,
        preview,
        read_checkpoints,
        rows,
    )
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
    out = Prepared(module, loss_of(shape), margin_of(shape), ckpts.listed, ckpts.states, labels,
                   rows(train.inputs, train.labels), train.labels.tolist(), lambda: clf.logits(train.inputs).cpu())
    out.clf = classifier(module, ckpts.states, r.model)

    def member(member_source: Any, member_name: str) -> Any:
        other = ProgramModule(load(member_source, ctx.device))
        if other.shape != module.shape or [t.shape for t in other.parameters()] != \
                [t.shape for t in module.parameters()]:
            raise ValueError(f"ensemble member {member_name!r} is not the architecture of {r.model!r}")
        return classifier(other, read_checkpoints(member_source, other, r.checkpoints, ctx.device).states,
                          member_name)

    out.member = member
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
    from models.hf.influence import TextModule, classifier, loss_of, margin_of, read_checkpoints, rows, width
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
        # the training rows as wide as the longest training text (what stored features were computed on), the test
        # rows as their own longest: a row's width does not change its gradients (the mask keeps padding out)
        length = width(clf, train.texts, r.max_length)
        train_rows = rows(clf, train.texts, train_labels, r.max_length, length)
    except ValueError as exc:
        raise JobError("invalid_request", str(exc)) from None
    out = Prepared(module, loss_of(), margin_of(), listed, states, labels, train_rows, train_labels,
                   lambda: clf.logits(train.texts).cpu(), train_texts=train.texts)
    out.clf = classifier(module, states, name=r.model)

    def member(member_source: Any, member_name: str) -> Any:
        other = load(member_source, ctx.device)
        if other.tokenizer.get_vocab() != clf.tokenizer.get_vocab() or other.info.model_type != clf.info.model_type:
            raise ValueError(f"ensemble member {member_name!r} has another tokenizer or architecture than "
                             f"{r.model!r}")
        text_module = TextModule(other)
        return classifier(text_module, read_checkpoints(member_source, text_module, r.checkpoints)[1],
                          name=member_name)

    out.member = member
    if r.mode == "self":
        return out
    out.test_ids, out.known, out.test_texts = ids, known, [t[:TEXT_SHOWN] for t in texts]
    out.predicted = clf.logits(texts).argmax(1).tolist()
    out.targets = [g if g is not None else p for g, p in zip(given, out.predicted, strict=True)]
    out.test_rows = rows(clf, texts, out.targets, r.max_length, width(clf, texts, r.max_length))
    return out


def run(request: ClassifierInfluenceRequest, ctx: JobContext) -> ClassifierInfluenceResult:
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
    chunk = chunk_size(r, parameters)
    labels = p.labels

    def example(j: int, score: float, self_influence: float | None = None) -> dict[str, Any]:
        out = {"index": j, "label": labels[p.train_labels[j]], "score": score, "self_influence": self_influence}
        if p.train_texts is not None:
            out["text"] = p.train_texts[j][:TEXT_SHOWN]
        if p.train_preview is not None:
            out["preview"] = p.train_preview(j)
        return out

    output = output_of(r)
    base: dict[str, Any] = {"model": r.model, "dataset": name, "mode": r.mode, "parameters": parameters,
                            "train_examples": len(p.train_rows), "checkpoints": p.listed, "labels": labels,
                            "estimator": r.estimator, "output": "cross_entropy" if output == "loss" else "margin"}
    run_estimator = {"tracin": _tracin, "ekfac": _ekfac}.get(r.estimator, _projected)
    return run_estimator(r, ctx, p, base, chunk, example, t0)


def _tracin(r: ClassifierInfluenceRequest, ctx: JobContext, p: Prepared, base: dict[str, Any], chunk: int,
            example: Any, t0: float) -> ClassifierInfluenceResult:
    """Exact TracIn-CP: the streaming pass (top-k in memory that does not grow with test x train) on the loss, or
    the dense scores with the margin on the test side; linear layers factorised where it pays (method ghost)."""
    from models.explain.classifier_estimators import gradient_model, tracin_scores
    from models.explain.tracin import TracIn

    def progress(done: int, total: int) -> None:
        ctx.progress(done, total, "chunks", message=f"{done}/{total} checkpoint x chunk passes")

    ghost = "auto" if r.method == "ghost" else "none"
    gradients = gradient_model(p.clf, p.states, "loss", ghost=ghost, device=ctx.device, batch_size=chunk)
    engine = TracIn(gradients, p.states, batch_size=chunk)
    if r.mode == "self":
        scores = engine.self_influence(p.train_rows, progress).float().cpu()
        return _ranking(ctx, p, _factorised(base, gradients), scores, p.train_logits().argmax(1).tolist(), r.top_k,
                        example, t0)
    assert p.test_ids is not None
    if output_of(r) == "margin":
        ctx.progress(0, 1, "passes", message=f"TracIn over {len(p.states)} checkpoints")
        if hasattr(gradients, "plan"):  # the layers the dense pass factorises (it decides the same way)
            gradients.plan(p.train_rows[:chunk])
        dense = tracin_scores(p.clf, p.states, p.test_rows, p.train_rows, output="margin", ghost=ghost,
                              device=ctx.device, batch_size=chunk).float()
        return _dense(ctx, p, _factorised(base, gradients), dense, r.top_k, example, t0)
    top = engine.top_influence(p.test_rows, p.train_rows, r.top_k, progress=progress)
    lists = [{key: [example(j, v, s) for j, v, s in top.listed(i, positive)]
              for key, positive in (("proponents", True), ("opponents", False))} for i in range(len(p.test_ids))]
    counts = [(float(top.test_self[i]), int(top.n_positive[i]), int(top.n_negative[i]))
              for i in range(len(p.test_ids))]
    return _tests(ctx, p, _factorised(base, gradients), lists, counts, t0)


def _factorised(base: dict[str, Any], gradients: Any) -> dict[str, Any]:
    """The result's ``factorised``: the linear layers the ghost path took (none: the vmap path)."""
    return {**base, "factorised": list(getattr(gradients, "factorised", ()))}


def _ekfac(r: ClassifierInfluenceRequest, ctx: JobContext, p: Prepared, base: dict[str, Any], chunk: int,
           example: Any, t0: float) -> ClassifierInfluenceResult:
    """Influence functions with EK-FAC through Kronfluence at the trained model (the last checkpoint): the
    factors fitted on the training examples, then Kronfluence's pairwise or self scores."""
    from dataclasses import replace

    from models.explain.ekfac import EKFAC, NotSupported

    try:
        import kronfluence  # noqa: F401
    except ImportError:
        raise JobError("unavailable", "estimator ekfac runs Kronfluence, which this worker lacks: pip install "
                       "'explainq[influence]' and pip install --no-deps kronfluence==1.0.1") from None
    clf = replace(p.clf, checkpoints=p.states[-1:])
    try:
        ek = EKFAC(clf, output=output_of(r), damping=r.ekfac_damping, batch_size=chunk, device=ctx.device,
                   seed=r.seed)
    except NotSupported as exc:
        raise JobError("invalid_request", f"model {r.model!r}: {exc}") from None
    with ek:
        ctx.progress(0, 2, "passes", message=f"fitting EK-FAC factors on {len(p.train_rows)} training examples")
        ek.fit(p.train_rows)
        ctx.progress(1, 2, "passes", message="scoring")
        layers = [n.removeprefix("layers.").removeprefix("model.").replace("__", ".") for n in ek.covered]
        base = {**base, "checkpoints": p.listed[-1:], "damping": r.ekfac_damping, "layers": layers,
                "parameters": ek.covered_parameters}
        if r.mode == "self":
            scores = ek.self_scores(p.train_rows)
            return _ranking(ctx, p, base, scores, p.train_logits().argmax(1).tolist(), r.top_k, example, t0)
        dense = ek.scores(p.test_rows, p.train_rows)
    return _dense(ctx, p, base, dense, r.top_k, example, t0)


def _ranking(ctx: JobContext, p: Prepared, base: dict[str, Any], scores: Any, predicted: list[int], top_k: int,
             example: Any, t0: float) -> ClassifierInfluenceResult:
    """Mode self: every training example ranked (``self_influence.csv``), the top ``top_k`` inline."""
    import torch

    labels = p.labels
    order = torch.argsort(scores, descending=True, stable=True).tolist()
    with open(ctx.artifact_path("self_influence.csv"), "w", newline="", encoding="utf-8") as fh:
        TableWriter(fh, ["rank", "index", "label", "predicted", "self_influence"]).rows(
            [rank, i, labels[p.train_labels[i]], labels[predicted[i]], float(scores[i])]
            for rank, i in enumerate(order, 1))
    return ClassifierInfluenceResult.model_validate({
        **base, "self_influence": [example(i, float(scores[i])) for i in order[:top_k]],
        "seconds": time.perf_counter() - t0, "artifacts": ctx.artifacts()})


def _tests(ctx: JobContext, p: Prepared, base: dict[str, Any], lists: list[dict[str, Any]],
           counts: list[tuple[float | None, int, int]], t0: float) -> ClassifierInfluenceResult:
    """Mode test: per test example its lists (and ``influence.csv``, every listed pair)."""
    assert p.test_ids is not None and p.targets is not None and p.predicted is not None and p.known is not None
    labels = p.labels
    tests, pairs = [], []
    for i, test_id in enumerate(p.test_ids):
        for key in ("proponents", "opponents"):
            pairs.extend([test_id, key[:-1], rank, e["index"], e["label"], e["score"]]
                         for rank, e in enumerate(lists[i][key], 1))
        own, n_pos, n_neg = counts[i]
        tests.append({"id": test_id, "target": labels[p.targets[i]], "predicted": labels[p.predicted[i]],
                      "label": p.known[i], "self_influence": own, "n_positive": n_pos, "n_negative": n_neg,
                      **lists[i], "text": p.test_texts[i] if p.test_texts is not None else None,
                      "preview": p.test_previews[i] if p.test_previews is not None else None})
    with open(ctx.artifact_path("influence.csv"), "w", newline="", encoding="utf-8") as fh:
        TableWriter(fh, ["test", "side", "rank", "index", "label", "influence"]).rows(pairs)
    return ClassifierInfluenceResult.model_validate({
        **base, "tests": tests, "seconds": time.perf_counter() - t0, "artifacts": ctx.artifacts()})


def _members(r: ClassifierInfluenceRequest, ctx: JobContext, p: Prepared) -> list[Any]:
    """The ensemble's other models as classifiers (trak_ensemble)."""
    out = []
    for member in r.ensemble or []:
        entry = registry.get_model(ctx.settings, member)
        if entry is None or entry.get("kind") not in DATASET_KINDS:
            raise JobError("unknown_model", f"ensemble member {member!r} is not a registered classifier")
        try:
            out.append(p.member(registry.local_path(ctx.settings, entry), member))
        except (ValueError, OSError) as exc:
            raise JobError("invalid_model", str(exc)) from None
    return out


def _projected(r: ClassifierInfluenceRequest, ctx: JobContext, p: Prepared, base: dict[str, Any], chunk: int,
               example: Any, t0: float) -> ClassifierInfluenceResult:
    """TRAK (one model or an ensemble: projected gradients of the margin at every checkpoint, the damped
    Gauss-Newton inverse, the training columns weighted by Q, averaged) and projected TracIn, through
    :mod:`models.explain.classifier_estimators`."""
    from models.explain import classifier_estimators as table

    if r.stored:
        return _stored(r, ctx, p, base, chunk, example, t0)
    kw = {"proj_dim": r.proj_dim, "seed": r.seed, "device": ctx.device, "batch_size": chunk,
          "projection": r.projection}
    base = {**base, "proj_dim": r.proj_dim, "projection": r.projection}
    try:
        return _projected_scores(r, ctx, p, base, kw, example, t0, table)
    except ValueError as exc:  # a dense projection too large for the model (models.explain.trak.check_projection)
        if "projection" not in str(exc):
            raise
        raise JobError("invalid_request", f"projection: {exc}") from None


def _projected_scores(r: ClassifierInfluenceRequest, ctx: JobContext, p: Prepared, base: dict[str, Any],
                      kw: dict[str, Any], example: Any, t0: float, table: Any) -> ClassifierInfluenceResult:
    members = _members(r, ctx, p) if r.estimator == "trak_ensemble" else []
    ctx.progress(0, 1, "passes", message=f"{r.estimator} over {len(p.states)} checkpoints"
                 + (f" and {len(members)} further models" if members else ""))
    if r.estimator == "tracin_projected":
        if r.mode == "self":
            scores = table.tracin_projected_self_scores(p.clf, p.states, p.train_rows, **kw).float()
            return _ranking(ctx, p, base, scores, p.train_logits().argmax(1).tolist(), r.top_k, example, t0)
        dense = table.tracin_projected_scores(p.clf, p.states, p.test_rows, p.train_rows, output=output_of(r),
                                              **kw).float()
        return _dense(ctx, p, base, dense, r.top_k, example, t0)
    base = {**base, "damping": r.damping, "ensemble": list(r.ensemble) if r.ensemble else None}
    kw["damping"] = r.damping
    if r.mode == "self":
        scores = table.trak_ensemble_self_scores(p.clf, r.checkpoints, p.train_rows, members=members, **kw).float()
        return _ranking(ctx, p, base, scores, p.train_logits().argmax(1).tolist(), r.top_k, example, t0)
    dense = table.trak_ensemble_scores(p.clf, r.checkpoints, p.test_rows, p.train_rows, members=members,
                                       **kw).float()
    return _dense(ctx, p, base, dense, r.top_k, example, t0)


def _stored(r: ClassifierInfluenceRequest, ctx: JobContext, p: Prepared, base: dict[str, Any], chunk: int,
            example: Any, t0: float) -> ClassifierInfluenceResult:
    """TRAK or projected TracIn from the features ``POST /featurize/classifier`` stored: the test examples'
    features computed now, the training rows' read in tiles, a streaming top-k (mode test) or every stored row's
    self-influence (mode self)."""
    from core.filestore import get_store
    from models.explain.classifier_features import (
        ESTIMATOR_LOSS,
        ClassifierFeatures,
        stored_self_scores,
        stored_top_k,
    )
    from models.explain.features import FeatureIndex, NotFeaturized

    store = get_store(ctx.settings)
    loss = ESTIMATOR_LOSS[r.estimator]
    try:
        index = FeatureIndex(store, ClassifierFeatures(p.clf, p.train_rows), "all", loss=loss, proj_dim=r.proj_dim,
                             seed=r.seed, train=p.train_rows, batch_size=chunk)
        ctx.use_shared(f"features/{k}" for k in index.keys)
        base = {**base, "proj_dim": r.proj_dim, "output": "margin" if loss == "margin" else "cross_entropy",
                "damping": r.damping if r.estimator == "trak" else None, "stored": True}
        if r.mode == "self":
            scores = stored_self_scores(store, index, r.estimator, r.damping).float()
            return _ranking(ctx, p, base, scores, p.train_logits().argmax(1).tolist(), r.top_k, example, t0)
        top = stored_top_k(store, index, p.test_rows, r.estimator, r.top_k, r.damping)
    except NotFeaturized as exc:
        raise JobError("not_featurized", f"{exc.args[0]} (POST /featurize/classifier with loss {loss!r}, the same "
                       f"checkpoints ({r.checkpoints}), proj_dim {r.proj_dim} and seed {r.seed})") from None
    lists, counts = [], []
    for i in range(len(p.test_rows)):
        lists.append({side: [example(int(j), float(v)) for j, v in zip(idx[i].tolist(), val[i].tolist(),
                                                                        strict=True) if j >= 0]
                      for side, idx, val in (("proponents", top.pro_idx, top.pro_val),
                                             ("opponents", top.opp_idx, top.opp_val))})
        counts.append((None, int(top.n_positive[i]), int(top.n_negative[i])))
    return _tests(ctx, p, base, lists, counts, t0)


def _dense(ctx: JobContext, p: Prepared, base: dict[str, Any], scores: Any, top_k: int, example: Any,
           t0: float) -> ClassifierInfluenceResult:
    """Mode test from dense scores ``[tests, train]``: each row's strongest positive and negative columns."""
    import torch

    k = min(top_k, scores.shape[1])
    lists, counts = [], []
    for row in scores:
        pro = torch.argsort(row, descending=True, stable=True)[:k].tolist()
        opp = torch.argsort(row, stable=True)[:k].tolist()
        lists.append({"proponents": [example(j, float(row[j])) for j in pro if row[j] > 0],
                      "opponents": [example(j, float(row[j])) for j in opp if row[j] < 0]})
        counts.append((None, int((row > 0).sum()), int((row < 0).sum())))
    return _tests(ctx, p, base, lists, counts, t0)
