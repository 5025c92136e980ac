"""Worker side of ``POST /evaluate/classifier/attribution`` and ``POST /evaluate/classifier/mislabel`` (the maths:
``models/export/evaluation.py``). The job functions take the validated request (``core.kinds.evaluate_classifier``)
and return the kind's result (``core.contract.results.classifier_evaluation``).

What an evaluation trains is kept in the store under content addresses (digests of the program, the recipe and the
data, so only a caller holding the same data reaches them), beside the ConvE evaluations' (the same retention):

- ``cache/evaluation/models/clf-<digest>/``: a model directory (``models.export.train.save_model`` or
  ``models.hf.train.save_model``: weights, spec or tokenizer, checkpoints): the recipe's full-data model, an ensemble member (the recipe with another seed), or the
  model of a mislabel evaluation's flipped labels;
- ``cache/evaluation/lds/clf-<digest>/subset-<i>.npz``: subset model ``i`` of a (design, model files, recipe, data,
  alpha, m, seed) ground truth: its mask over the training examples, its margins on the whole test split, its mask
  seed and training seed (``models.kg.evaluation``'s seeds); ``replicate-<i>.npz`` its replicate.

As ``workers.jobs.evaluate``: every model has a fixed position in :func:`_models` (subset models ``0..m-1``, their
replicates, the full-data model, the members); a parent whose models are all stored computes the result whole,
otherwise it fans out one shard per missing position (the shard's range is that position) and records the data
version it planned for; shards and the reduce step refuse other data. Whole and reduced go through
:func:`_finish_lds`.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from core import dataset_refs, lastuse, registry
from core.artifacts import artifacts_key
from core.contract.kind import ReduceRequest, ShardRequest
from core.contract.results.base import Shards
from core.contract.results.classifier_evaluation import ClassifierLdsResult, ClassifierMislabelResult
from core.filestore import StoreError, get_store
from core.kinds.evaluate import MAX_SCORE_CELLS
from core.kinds.evaluate_classifier import (
    ClassifierRecipe,
    EvaluateClassifierAttributionRequest,
    EvaluateClassifierMislabelRequest,
)
from core.kinds.train_classifier import DATASET_KINDS, HF_KIND, MODEL_KIND
from core.userfiles import files_for
from workers.context import JobContext, JobError
from workers.context import json_safe as _clean
from workers.fanout import Planned, fan_out, shard_done
from workers.fanout import run_shard as run_shard_once
from workers.jobs.evaluate import PLAN_META, EvaluationPlan, _artifacts, _planned, _result_file

KIND = "evaluate_classifier_attribution"
ROOT = lastuse.EVALUATION_ROOT  # "cache/evaluation"
FULL = -1  # the full-data model in _models; ensemble member j is -2 - j, the replicate of subset model i is m + i
OUTPUT = "margin log p / (1 - p) of the test example's label (TRAK's classification margin), the trained weights"


# ------------------------------------------------------------------------------------------------ shared
class Inputs:
    """The evaluation's model (the program and spec, or the Hugging Face checkpoint, every model starts from) and
    data (its splits), with their digests, and what each family does with them (train, load, rows)."""

    def __init__(self, ctx: JobContext, model: str, dataset: str) -> None:
        entry = registry.get_model(ctx.settings, model)
        if entry is None or entry.get("kind") not in (MODEL_KIND, HF_KIND):
            raise JobError("unknown_model", f"model {model!r} is not a registered exported or Hugging Face "
                           "classifier")
        self.ctx, self.hf = ctx, entry["kind"] == HF_KIND
        self.source = registry.local_path(ctx.settings, entry)
        h = hashlib.sha256()
        for f in sorted(p for p in Path(self.source).iterdir() if p.is_file() and p.name != "checkpoints.json"):
            h.update(f"\0{f.name}\0".encode())
            h.update(f.read_bytes())
        self.model_version = h.hexdigest()
        ref = dataset_refs.resolve(ctx.settings, dataset, ctx.owner, DATASET_KINDS[entry["kind"]])
        directory = registry.absolute_path(ctx.settings, ref.entry) if ref.entry is not None else ref.path
        files = files_for(ctx.settings, directory)
        try:
            if self.hf:
                from models.textdata import read_split, split_files

                self.splits = {s: read_split(f, files) for s, f in split_files(directory).items()}
            else:
                from models.export.train import read_split

                self.splits = {s: read_split(directory / f"{s}.safetensors", files)
                               for s in ("train", "valid", "test") if (directory / f"{s}.safetensors").is_file()}
        except (ValueError, OSError) as exc:
            raise JobError("bad_dataset", f"dataset {dataset!r}: {exc}") from None
        if "train" not in self.splits:
            raise JobError("bad_dataset", f"dataset {dataset!r} has no train split")
        h = hashlib.sha256()
        for name in sorted(self.splits):
            split = self.splits[name]
            h.update(f"\0{name}\0".encode())
            if self.hf:
                h.update(json.dumps([split.texts, split.labels]).encode())
            else:
                from models.export import evaluation as ef

                h.update(ef.data_version({name: split}).encode())
        self.data_version = h.hexdigest()
        if self.hf:
            self.classes = [str(c) for c in (entry.get("meta") or {}).get("labels") or []]
        else:
            self.spec = json.loads((Path(self.source) / "spec.json").read_text())
            self.classes = [str(c) for c in self.spec.get("labels") or []]
        self.n_classes = len(self.classes)

    @property
    def train(self) -> Any:
        return self.splits["train"]

    def size(self, split: Any) -> int:
        return len(split.labels)

    def take(self, split: Any, positions: Any) -> Any:
        """The examples of ``split`` at ``positions`` (an int array)."""
        if self.hf:
            from models.hf.evaluation import subset

            return subset(split, positions)
        import torch

        idx = torch.from_numpy(positions)
        return type(split)(split.inputs[idx], split.labels[idx])

    def label_indices(self, split: Any) -> Any:
        """``int64[N]`` tensor: each example's class index."""
        if not self.hf:
            return split.labels
        import torch

        from models.hf.evaluation import labels_of

        try:
            return torch.tensor(labels_of(split, self.classes), dtype=torch.long)
        except ValueError as exc:
            raise JobError("bad_dataset", str(exc)) from None

    def relabelled(self, split: Any, labels: Any) -> Any:
        """``split`` with the class indices ``labels``."""
        if self.hf:
            from models.textdata import TextSplit

            return TextSplit(list(split.texts), [self.classes[int(i)] for i in labels])
        return type(split)(split.inputs, labels)

    def train_model(self, data: Any, opts: Any, seed: int, out: Path) -> None:
        if self.hf:
            from models.hf.evaluation import train_recipe

            train_recipe(Path(self.source), data, opts, seed, out=out, device=self.ctx.device)
        else:
            from models.export.evaluation import train_recipe

            train_recipe(Path(self.source) / "model.pt2", self.spec, data, opts, seed, out=out)

    def train_subset(self, opts: Any, alpha: float, seed: int, train_seed: int, test: Any) -> dict[str, Any]:
        if self.hf:
            from models.hf.evaluation import train_subset

            return train_subset(Path(self.source), self.train, opts, alpha, seed, train_seed, test, self.ctx.device)
        from models.export.evaluation import train_subset as train_program_subset

        return train_program_subset(Path(self.source) / "model.pt2", self.spec, self.train, opts, alpha, seed,
                                    train_seed, test)

    def load(self, directory: Path, name: str) -> tuple[Any, Any]:
        """The estimators' ``Classifier`` of a stored model directory, and what :meth:`rows` needs of it."""
        if self.hf:
            from models.hf.evaluation import read_classifier

            return read_classifier(directory, name, self.ctx.device)
        from models.export.evaluation import read_classifier as read_program

        return read_program(directory, name, self.ctx.device), None

    def rows(self, split: Any, loaded: Any, max_length: int) -> Any:
        try:
            if self.hf:
                from models.hf.evaluation import rows as text_rows

                return text_rows(loaded, split, max_length)
            from models.export.influence import rows

            return rows(split.inputs, split.labels)
        except ValueError as exc:
            raise JobError("bad_dataset", str(exc)) from None

    def accuracy(self, directory: Path, max_length: int) -> dict[str, float | None]:
        if self.hf:
            from models.hf.checkpoint import load
            from models.hf.train import Encoded, accuracy

            clf = load(directory, self.ctx.device)
            return {s: accuracy(clf, Encoded(clf, d, max_length, s)) for s, d in self.splits.items()}
        from models.export.program import load as load_program
        from models.export.train import accuracy as program_accuracy

        program = load_program(directory, self.ctx.device)
        return {s: program_accuracy(program, d) for s, d in self.splits.items()}


def _recipe(recipe: ClassifierRecipe) -> dict[str, Any]:
    return recipe.model_dump(mode="json")


def _options(recipe: dict[str, Any]) -> Any:
    from models.training import TrainOptions

    return TrainOptions(**recipe)


def _model_key(digest: str) -> str:
    return f"{ROOT}/models/clf-{digest}"


def _train_model(ctx: JobContext, inputs: Inputs, data: Any, recipe: dict[str, Any], key: str,
                 extra: dict[str, Any] | None = None) -> None:
    """The recipe from the initial model on ``data`` into the store at ``key`` (a model directory)."""
    staging = ctx.settings.work_dir / f"eval-clf-{uuid.uuid4().hex[:12]}"
    try:
        inputs.train_model(data, _options({**recipe, "seed": 0}), recipe["seed"], staging)
        for name, value in (extra or {}).items():
            (staging / name).write_text(json.dumps(value))
        store = get_store(ctx.settings)
        try:
            store.put_dir(staging, key)
        except StoreError:
            if not store.exists(f"{key}/checkpoints.json"):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _load_model(ctx: JobContext, inputs: Inputs, key: str, name: str) -> tuple[Any, Any]:
    try:
        return inputs.load(get_store(ctx.settings).local_dir(key), name)
    except (ValueError, OSError) as exc:
        raise JobError("invalid_model", f"the stored model {key.rsplit('/', 1)[-1]}: {exc}") from None


def _model_ref(ctx: JobContext, inputs: Inputs, key: str, seed: int, max_length: int) -> dict[str, Any]:
    directory = get_store(ctx.settings).local_dir(key)
    listed = json.loads((Path(directory) / "checkpoints.json").read_text())
    return {"key": key.rsplit("/", 1)[-1], "seed": seed, "accuracy": inputs.accuracy(Path(directory), max_length),
            "checkpoints": [{"epoch": c["epoch"], "lr": c["lr"]} for c in listed]}


# ------------------------------------------------------------------------------------------------ LDS
def _identity(request: EvaluateClassifierAttributionRequest, inputs: Inputs) -> dict[str, Any]:
    from models.kg import evaluation as ev

    recipe = _recipe(request.recipe)
    full = {**recipe, "seed": ev.full_model_seed(request.seed, request.recipe.seed)}
    members = [{**full, "seed": s} for s in ev.member_seeds(full["seed"], request.members())]
    base = {"model": inputs.model_version, "data": inputs.data_version}
    return {"full": ev.content_key(what="classifier-full", recipe=full, **base), "full_recipe": full,
            "members": [ev.content_key(what="classifier-full", recipe=r, **base) for r in members],
            "member_recipes": members,
            "lds": ev.content_key(what="classifier-lds", design=ev.LDS_DESIGN, recipe=recipe, alpha=request.alpha,
                                  m=request.m, seed=request.seed, **base),
            "seeds": ev.subset_seeds(request.seed, request.m),
            "train_seeds": ev.subset_train_seeds(request.seed, request.m),
            "replicate_seeds": ev.subset_replicate_seeds(request.seed, request.m)}


def _models(request: EvaluateClassifierAttributionRequest) -> list[int]:
    m = request.m
    replicates = list(range(m, 2 * m)) if request.replicates else []
    return [*range(m), *replicates, FULL, *(FULL - 1 - j for j in range(request.members()))]


def _gt_key(ident: dict[str, Any], name: str, i: int) -> str:
    return f"{ROOT}/lds/clf-{ident['lds']}/{name}-{i:05d}.npz"


def _stored_at(ident: dict[str, Any], m: int, item: int) -> str:
    if item == FULL:
        return f"{_model_key(ident['full'])}/checkpoints.json"
    if item < FULL:
        return f"{_model_key(ident['members'][FULL - 1 - item])}/checkpoints.json"
    return _gt_key(ident, "replicate", item - m) if item >= m else _gt_key(ident, "subset", item)


def _missing(ctx: JobContext, request: EvaluateClassifierAttributionRequest, ident: dict[str, Any]) -> list[int]:
    store = get_store(ctx.settings)
    return [p for p, item in enumerate(_models(request)) if not store.exists(_stored_at(ident, request.m, item))]


def _test(inputs: Inputs) -> Any:
    if "test" not in inputs.splits or len(inputs.splits["test"].labels) == 0:
        raise JobError("bad_dataset", "the dataset has no test split to evaluate on")
    return inputs.splits["test"]


def _train_item(ctx: JobContext, request: EvaluateClassifierAttributionRequest, inputs: Inputs,
                ident: dict[str, Any], item: int) -> bool:
    """Train one model of the evaluation (False when another job stored it meanwhile)."""
    import numpy as np

    store = get_store(ctx.settings)
    if store.exists(_stored_at(ident, request.m, item)):
        return False
    if item == FULL:
        ctx.progress(0, 1, "models", message="full-data model")
        _train_model(ctx, inputs, inputs.train, ident["full_recipe"], _model_key(ident["full"]))
        return True
    if item < FULL:
        j = FULL - 1 - item
        ctx.progress(0, 1, "models", message=f"ensemble member {j + 1}/{len(ident['members'])}")
        _train_model(ctx, inputs, inputs.train, ident["member_recipes"][j], _model_key(ident["members"][j]))
        return True
    m = request.m
    index, replicate = (item - m, True) if item >= m else (item, False)
    seed = ident["seeds"][index]
    train_seed = ident["replicate_seeds" if replicate else "train_seeds"][index]
    ctx.progress(0, 1, "models", message=f"{'replicate of ' if replicate else ''}subset model {index + 1}/{m}")
    try:
        out = inputs.train_subset(_options(_recipe(request.recipe)), request.alpha, seed, train_seed, _test(inputs))
    except ValueError as exc:
        raise JobError("bad_dataset", str(exc)) from None
    buf = io.BytesIO()
    np.savez(buf, mask=out["mask"], outputs=out["outputs"], seed=np.int64(seed), index=np.int64(index),
             train_seed=np.int64(train_seed))
    store.put_bytes(buf.getvalue(), _stored_at(ident, m, item))
    return True


def load_ground_truth(settings: Any, ident: dict[str, Any], m: int, name: str = "subset") -> tuple[Any, Any]:
    """``(masks [m, n_train] bool, outputs [m, n_test_split])`` of a stored ground truth (or its replicates)."""
    import numpy as np

    store = get_store(settings)
    masks, outputs = [], []
    for i in range(m):
        with np.load(io.BytesIO(store.read_bytes(_gt_key(ident, name, i)))) as z:
            masks.append(z["mask"])
            outputs.append(z["outputs"])
    return np.stack(masks), np.stack(outputs)


def _prepare(ctx: JobContext, request: EvaluateClassifierAttributionRequest) -> tuple[Inputs, dict[str, Any]]:
    inputs = Inputs(ctx, request.model, request.dataset)
    _test(inputs)
    ident = _identity(request, inputs)
    ctx.use_shared([f"{ROOT}/lds/clf-{ident['lds']}", _model_key(ident["full"]),
                    *(_model_key(k) for k in ident["members"])])
    return inputs, ident


def _same_data(inputs: Inputs, plan: EvaluationPlan, request: EvaluateClassifierAttributionRequest) -> None:
    if inputs.data_version + inputs.model_version != plan.data_version:
        raise JobError("dataset_changed", f"dataset {request.dataset!r} or model {request.model!r} changed since "
                       "the evaluation started")


def run_attribution(request: EvaluateClassifierAttributionRequest, ctx: JobContext) -> ClassifierLdsResult | Planned:
    """The LDS whole when every model it needs is stored; otherwise one shard per missing model, and the reduce
    step computes it."""
    inputs, ident = _prepare(ctx, request)
    missing = _missing(ctx, request, ident)
    if not missing:
        result = _finish_lds(ctx, request, inputs, ident, 0, None, ctx.artifact_path)
        ctx.artifact_path("result.json").write_text(_result_file(result))
        return result.model_copy(update={"artifacts": _artifacts(ctx.artifacts())})
    ctx.set_meta(PLAN_META, EvaluationPlan(data_version=inputs.data_version + inputs.model_version).model_dump())

    def one_model(carried: dict[str, Any], start: int, end: int) -> tuple[dict[str, Any], int, int]:
        return carried, missing[start], missing[start] + 1

    return fan_out(ctx, KIND, request, len(missing), 1, retries=request.shard_retries, max_failed_fraction=0.0,
                   shard_items=one_model)


def run_shard(shard: ShardRequest[EvaluateClassifierAttributionRequest], ctx: JobContext) -> dict[str, Any]:
    """Train the model at position ``start`` of the evaluation's :func:`_models` (as planned)."""
    request = shard.request

    def work() -> dict[str, Any]:
        inputs, ident = _prepare(ctx, request)
        _same_data(inputs, _planned(ctx, shard.parent), request)
        models = _models(request)
        if shard.end > len(models) or shard.start >= shard.end:
            raise JobError("invalid_payload", f"shard range [{shard.start}, {shard.end}) is not within the "
                           f"evaluation's {len(models)} models")
        items = models[shard.start:shard.end]
        trained = sum(_train_item(ctx, request, inputs, ident, item) for item in items)
        return {"items": items, "trained": int(trained)}

    return run_shard_once(ctx, work)


def run_reduce(reduce: ReduceRequest[EvaluateClassifierAttributionRequest], ctx: JobContext) -> ClassifierLdsResult:
    request = reduce.request
    inputs, ident = _prepare(ctx, request)
    _same_data(inputs, _planned(ctx, reduce.parent), request)
    done = [shard_done(ctx, reduce.parent, i) for i in range(reduce.shards)]
    failed = [i for i, d in enumerate(done) if d is None]
    missing = _missing(ctx, request, ident)
    if missing:
        raise JobError("too_many_failures", f"{len(missing)} of the evaluation's models are missing (shards "
                       f"{failed[:20]} failed): the LDS needs every model it planned")
    trainings = sum(int(d["trained"]) for d in done if d is not None)
    out_dir = ctx.settings.work_dir / f"{ctx.job_id}-merged"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = _finish_lds(ctx, request, inputs, ident, trainings, Shards(total=reduce.shards, failed=failed),
                             lambda name: out_dir / name)
        (out_dir / "result.json").write_text(_result_file(result))
        store = get_store(ctx.settings)
        store.sync_dir(out_dir, artifacts_key(reduce.parent))
        return result.model_copy(update={"artifacts": _artifacts(store.list_files(artifacts_key(reduce.parent)))})
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _finish_lds(ctx: JobContext, request: EvaluateClassifierAttributionRequest, inputs: Inputs,
                ident: dict[str, Any], trainings: int, shards: Shards | None, path_of: Any) -> ClassifierLdsResult:
    """The estimators' LDS on the stored ground truth (whole or in the reduce step: the same code, the same
    result); its files written at ``path_of(name)``."""
    import numpy as np

    from models.export.evaluation import lds_report
    from models.kg.evaluation import LDS_DESIGN, noise_ceiling, test_selection, underpowered

    m, seed, names = request.m, request.seed, list(request.estimators)
    masks, outputs = load_ground_truth(ctx.settings, ident, m)
    clf, loaded = _load_model(ctx, inputs, _model_key(ident["full"]), request.model)
    members = [_load_model(ctx, inputs, _model_key(k), f"{request.model} member {j + 1}")[0]
               for j, k in enumerate(ident["members"])]
    test = _test(inputs)
    sel = test_selection(len(test.labels), request.n_test, seed)
    max_length = request.recipe.max_length
    test_rows = inputs.rows(inputs.take(test, sel), loaded, max_length)
    train_rows = inputs.rows(inputs.train, loaded, max_length)

    def progress(done: int, total: int, message: str) -> None:
        ctx.progress(done, total, "estimators", message=message)

    scores: dict[str, Any] = {}
    try:
        report = lds_report(clf, masks, outputs[:, sel], test_rows, train_rows, names, seed, members=members,
                            progress=progress, scores=scores)
    except ValueError as exc:
        raise JobError("estimator_failed", str(exc)) from None
    ceiling, extra = None, {}
    if request.replicates:
        _, again = load_ground_truth(ctx.settings, ident, m, "replicate")
        extra["replicate_outputs"] = again[:, sel]
        ceiling = noise_ceiling(outputs[:, sel], extra["replicate_outputs"], seed)
    np.savez(path_of("ground_truth.npz"), masks=masks, outputs=outputs[:, sel], test_index=sel,
             seeds=np.asarray(ident["seeds"], dtype=np.int64), **extra)
    if len(sel) * inputs.size(inputs.train) <= MAX_SCORE_CELLS:  # the scores behind each LDS, for a check
        np.savez(path_of("scores.npz"), **scores)
    result = {
        "metric": "lds", "model": request.model, "model_version": inputs.model_version, "dataset": request.dataset,
        "data_version": inputs.data_version, "recipe": _recipe(request.recipe), "seed": seed,
        "n_train": inputs.size(inputs.train), "trainings": trainings, "m": m, "alpha": request.alpha,
        "design": LDS_DESIGN, "seeds": ident["seeds"], "train_seeds": ident["train_seeds"],
        "replicate_seeds": ident["replicate_seeds"] if request.replicates else None,
        "subset_size": int(masks[0].sum()), "n_test": len(sel), "test_index": sel.tolist(), "output": OUTPUT,
        "ground_truth": {"key": ident["lds"], "full_model": ident["full"], "trainings": trainings,
                         "reused": len(_models(request)) - trainings},
        "noise_ceiling": ceiling,
        "ensemble": {"members": len(members), "seeds": [r["seed"] for r in ident["member_recipes"]],
                     "models": ident["members"]},
        "full_model": _model_ref(ctx, inputs, _model_key(ident["full"]), ident["full_recipe"]["seed"],
                                 max_length),
        "estimators": report, "shards": shards, "warnings": underpowered(report),
    }
    return ClassifierLdsResult.model_validate(_clean(result))


# ------------------------------------------------------------------------------------------------ mislabels
def run_mislabel(request: EvaluateClassifierMislabelRequest, ctx: JobContext) -> ClassifierMislabelResult:
    import numpy as np

    from models.export.evaluation import flip_labels, mislabel_report
    from models.kg import evaluation as ev

    inputs = Inputs(ctx, request.model, request.dataset)
    if inputs.n_classes < 2:
        raise JobError("invalid_model", f"model {request.model!r} has fewer than two classes")
    labels, flipped = flip_labels(inputs.label_indices(inputs.train), inputs.n_classes, request.fraction,
                                  request.seed)
    data = inputs.relabelled(inputs.train, labels)
    recipe = {**_recipe(request.recipe), "seed": ev.full_model_seed(request.seed, request.recipe.seed)}
    key = _model_key(ev.content_key(what="classifier-mislabel", recipe=recipe, model=inputs.model_version,
                                    data=inputs.data_version, fraction=request.fraction, seed=request.seed))
    record = {"flipped": flipped.tolist(), "labels": labels[flipped].tolist()}
    store = get_store(ctx.settings)
    ctx.use_shared([key])
    trainings = 0
    if not store.exists(f"{key}/checkpoints.json"):
        ctx.progress(0, 1, "models", message="model of the flipped labels")
        _train_model(ctx, inputs, data, recipe, key, extra={"flipped.json": record})
        trainings = 1
    clf, loaded = _load_model(ctx, inputs, key, request.model)
    stored = json.loads((Path(store.local_dir(key)) / "flipped.json").read_text())
    if stored != record:
        raise JobError("cache_mismatch", "the stored model of the flipped labels does not match this request's "
                       "flips; delete it from the store's cache/evaluation/models/ to train it again")

    def progress(done: int, total: int, message: str) -> None:
        ctx.progress(done, total, "estimators", message=message)

    self_scores: dict[str, Any] = {}
    try:
        report = mislabel_report(clf, inputs.rows(data, loaded, request.recipe.max_length), flipped, list(request.estimators),
                                 request.seed, progress=progress, scores=self_scores)
    except ValueError as exc:
        raise JobError("estimator_failed", str(exc)) from None
    for r in report.values():
        r["auc_interval"]["n_resamples"] = ev.N_RESAMPLES
    np.savez(ctx.artifact_path("self_scores.npz"), flipped=flipped, **self_scores)
    result = ClassifierMislabelResult.model_validate(_clean({
        "metric": "mislabel", "model": request.model, "model_version": inputs.model_version,
        "dataset": request.dataset, "data_version": inputs.data_version, "recipe": _recipe(request.recipe),
        "seed": request.seed, "n_train": len(labels), "trainings": trainings, "fraction": request.fraction,
        "n_flipped": int(len(flipped)), "flipped": flipped.tolist(),
        "mislabel_model": _model_ref(ctx, inputs, key, recipe["seed"], request.recipe.max_length), "estimators": report,
    }))
    ctx.artifact_path("result.json").write_text(_result_file(result))
    return result.model_copy(update={"artifacts": _artifacts(ctx.artifacts())})
