"""Worker side of ``POST /evaluate/attribution`` and ``POST /evaluate/mislabel`` (the maths:
``models/kg/evaluation.py``). The job functions take the validated request (``core.kinds.evaluate``) and return
the kind's result model (``core.contract.results.evaluation``: :class:`LdsResult`, :class:`MislabelResult`).

What an evaluation trains is kept in the store, content-addressed, and reused by every later evaluation that asks
for the same thing (whoever asks: the address is a digest of the data itself, so only a caller who holds the same
data can reach it):

- ``cache/evaluation/models/<digest>/``: a ConvE model directory, the full-data model of a recipe and a data
  version (the model the estimators run on; an ensemble member is the full-data model of the recipe with another
  seed, so it has the same address as that recipe's full-data model), or, for mislabel detection, the model of the
  corrupted graph (its ``corruption.json`` records the corrupted triples);
- ``cache/evaluation/lds/<digest>/subset-<i>.npz``: subset model ``i`` of a (design version, recipe, data
  version, alpha, m, seed) ground truth: its mask over the training triples, its outputs (margins) on the whole test
  split, its mask seed and training seed (``models.kg.evaluation.design_seed``: every seed of an evaluation is
  derived from its seed, so evaluations with other seeds are independent replicates; the design version keeps a
  ground truth of an older derivation from being served);
  ``replicate-<i>.npz`` the same for its replicate (the same subset trained with another seed), when an evaluation
  asked for the noise ceiling (``replicates``).

One shape whole or sharded. An LDS evaluation whose models are all stored runs as one job (no training) and
returns its :class:`LdsResult` with ``shards`` None. Otherwise it fans out one shard per missing model and its
reduce step computes the same :class:`LdsResult` (``shards`` set). Both go through ``_finish_lds``, so they differ
only in ``trainings`` / ``ground_truth.trainings`` / ``ground_truth.reused`` (what this job trained), the
estimators' ``seconds``, ``shards`` and the size of ``result.json``.

How a shard knows what to train (the typed ``ShardRequest[EvaluateAttributionRequest]`` carries the request and a
range, nothing else):

- Every model an evaluation needs has a fixed position in :func:`_models`, a deterministic function of the request
  alone: the subset models ``0..m-1``, their replicates ``m..2m-1`` (with ``replicates``), the full-data model,
  then the ensemble members. The parent plans one shard per position whose model is missing from the store, and
  gives each shard, through ``fan_out``'s ``shard_items``, the range ``[p, p + 1)`` of that position ``p`` in
  this list (not its rank among the missing ones). So a shard trains exactly the model the parent planned, even
  when another evaluation stored some models in between (recomputing the missing list in the shard would shift
  the ranks), and a parent re-planned after a shutdown cannot make an existing shard train another model: each
  shard's payload names its own model. A model another job stored meanwhile is skipped (``trained`` 0).
- The data version the plan was made for is recorded in the parent job's meta (``evaluation_plan``) before any
  shard exists; each shard and the reduce step read it and refuse data that changed since (``dataset_changed``),
  instead of training models of other data or computing an LDS that mixes two versions.
"""

from __future__ import annotations

import io
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from core import lastuse
from core.artifacts import artifacts_key
from core.contract.kind import ReduceRequest, ShardRequest
from core.contract.results.base import Shards
from core.contract.results.evaluation import LdsResult, MislabelResult
from core.filestore import StoreError, get_store
from core.kinds.evaluate import MAX_SCORE_CELLS, EvaluateAttributionRequest, EvaluateMislabelRequest, Recipe
from models.tables import TableWriter
from workers.context import JobContext, JobError
from workers.context import json_safe as _clean
from workers.fanout import Planned, fan_out, shard_done, write_jsonl
from workers.fanout import run_shard as run_shard_once

KIND = "evaluate_attribution"
ROOT = lastuse.EVALUATION_ROOT  # "cache/evaluation"
FULL = -1  # the code of the full-data model in _models; ensemble member j is -2 - j, the replicate of subset
# model i (same subset, another seed; ``replicates``) is m + i
PLAN_META = "evaluation_plan"  # the parent's meta field that records the data version its plan was made for
OUTPUT = ("margin of the true tail on the tail query (h, r, ?): s_t - logsumexp_{e != t} s_e (TRAK's multi-class "
          "margin), model in eval mode")
MAX_LISTED_CORRUPTED = 10_000  # corrupted triples listed in the result (all of them in corrupted.tsv)
MAX_LISTED_SUSPECTS = 50  # training triples of each estimator's ranking listed in the result (all: suspects.csv)
SUSPECT_COLUMNS = ["estimator", "rank", "train_index", "head", "relation", "tail", "self_influence", "corrupted",
                   "original_tail"]


# ------------------------------------------------------------------------------------------------ shared
def _dataset(ctx: JobContext, name: str) -> Any:
    from core.contract.errors import FieldError
    from core.kinds.train_conve import resolve_dataset
    from core.userfiles import UserFileError, files_for
    from models.kg.triples import TriplesFormatError, load_nations, load_triples_dir
    from workers.context import user_dataset

    try:
        path = resolve_dataset(ctx.settings, name, ctx.owner)
        if path is None:
            return load_nations()
        path = user_dataset(ctx, resolve_dataset, name)
        return load_triples_dir(path, name, files_for(ctx.settings, path))
    except FieldError as exc:
        raise JobError("bad_dataset", exc.message) from None
    except (TriplesFormatError, FileNotFoundError, UserFileError) as exc:
        raise JobError("bad_dataset", str(exc)) from None
    except UnicodeDecodeError:
        raise JobError("bad_dataset", f"dataset {name!r}: a file is not UTF-8 text") from None


def _recipe(recipe: Recipe) -> dict[str, Any]:
    """The recipe as JSON (what the content addresses digest, as the API stored it)."""
    return recipe.model_dump(mode="json")


def _config(recipe: dict[str, Any]) -> Any:
    from models.kg.train import TrainConfig

    return TrainConfig(**recipe)


def _train_progress(ctx: JobContext, what: str) -> Any:
    def progress(done: int, total: int, message: str, metrics: dict | None) -> None:
        ctx.progress(done, total, "batches", message=f"{what}: {message}", metrics=metrics)
    return progress


def _model_key(digest: str) -> str:
    return f"{ROOT}/models/{digest}"


def _put_model(ctx: JobContext, local: Path, key: str) -> None:
    """Upload a model directory; another job that put the same content first wins (same digest, same data)."""
    store = get_store(ctx.settings)
    try:
        store.put_dir(local, key)
    except StoreError:
        if not store.exists(f"{key}/config.json"):
            raise


def _load_model(ctx: JobContext, key: str) -> Any:
    from models.kg.checkpoint import load

    return load(get_store(ctx.settings).local_dir(key), ctx.device)


def _train_full(ctx: JobContext, ds: Any, recipe: dict[str, Any], key: str, extra: dict[str, Any] | None = None,
                what: str = "full-data model") -> None:
    """Train the recipe on ``ds`` (valid/test kept for its metrics) into the store at ``key``."""
    from models.kg.evaluation import train_model

    staging = ctx.settings.work_dir / f"eval-model-{uuid.uuid4().hex[:12]}"
    try:
        train_model(ds, _config(recipe), staging, ctx.device, _train_progress(ctx, what))
        for name, value in (extra or {}).items():
            (staging / name).write_text(json.dumps(value))
        _put_model(ctx, staging, key)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _split_metrics(bundle: Any) -> dict[str, Any]:
    """A trained model's validation and test metrics (its metrics.json also holds the training history)."""
    return {k: v for k, v in (bundle.metrics or {}).items() if k in ("valid", "test")}


# ------------------------------------------------------------------------------------------------ LDS
def _full_recipe(request: EvaluateAttributionRequest) -> dict[str, Any]:
    """The recipe of the full-data model: the request's, with the seed :func:`full_model_seed` derives from the
    evaluation's seed and the recipe's (another evaluation seed: another full-data model)."""
    from models.kg.evaluation import full_model_seed

    return {**_recipe(request.recipe), "seed": full_model_seed(request.seed, request.recipe.seed)}


def _member_recipes(request: EvaluateAttributionRequest) -> list[dict[str, Any]]:
    from models.kg.evaluation import member_seeds

    full = _full_recipe(request)
    return [{**full, "seed": s} for s in member_seeds(full["seed"], request.members())]


def _identity(request: EvaluateAttributionRequest, ds: Any) -> dict[str, Any]:
    """The store addresses of what the evaluation needs, from the request and the data."""
    from models.kg import evaluation as ev

    version = ev.data_version(ds)
    recipe = _recipe(request.recipe)
    full = _full_recipe(request)
    members = _member_recipes(request)
    return {"data_version": version,
            "full": ev.content_key(what="full", recipe=full, data=version, checkpoints=ev.FULL_MODEL_CHECKPOINTS),
            "full_recipe": full,
            "members": [ev.content_key(what="full", recipe=r, data=version, checkpoints=ev.FULL_MODEL_CHECKPOINTS)
                        for r in members],
            "member_recipes": members,
            "lds": ev.content_key(what="lds", design=ev.LDS_DESIGN, recipe=recipe, data=version,
                                  alpha=request.alpha, m=request.m, seed=request.seed),
            "seeds": ev.subset_seeds(request.seed, request.m),
            "train_seeds": ev.subset_train_seeds(request.seed, request.m),
            "replicate_seeds": ev.subset_replicate_seeds(request.seed, request.m)}


def _models(request: EvaluateAttributionRequest) -> list[int]:
    """Every model the evaluation needs, in a fixed order that depends on the request alone (a shard's range is a
    position in this list): subset model i as i, its replicate as m + i (with ``replicates``), the full-data model
    as FULL, ensemble member j as FULL - 1 - j."""
    m = request.m
    replicates = list(range(m, 2 * m)) if request.replicates else []
    return [*range(m), *replicates, FULL, *(FULL - 1 - j for j in range(request.members()))]


def _subset_key(ident: dict[str, Any], i: int) -> str:
    return f"{ROOT}/lds/{ident['lds']}/subset-{i:05d}.npz"


def _replicate_key(ident: dict[str, Any], i: int) -> str:
    return f"{ROOT}/lds/{ident['lds']}/replicate-{i:05d}.npz"


def _stored_at(ident: dict[str, Any], m: int, item: int) -> str:
    """The store key whose presence says the model ``item`` (a code of :func:`_models`) is stored."""
    if item == FULL:
        return f"{_model_key(ident['full'])}/config.json"
    if item < FULL:
        return f"{_model_key(ident['members'][FULL - 1 - item])}/config.json"
    return _replicate_key(ident, item - m) if item >= m else _subset_key(ident, item)


def _missing(ctx: JobContext, request: EvaluateAttributionRequest, ident: dict[str, Any]) -> list[int]:
    """The positions in :func:`_models` of the models the store lacks."""
    store = get_store(ctx.settings)
    return [p for p, item in enumerate(_models(request)) if not store.exists(_stored_at(ident, request.m, item))]


def _train_item(ctx: JobContext, request: EvaluateAttributionRequest, ds: Any, ident: dict[str, Any],
                item: int) -> bool:
    """Train one model of the evaluation (False when another job stored it meanwhile)."""
    import numpy as np

    store = get_store(ctx.settings)
    if store.exists(_stored_at(ident, request.m, item)):
        return False
    if item == FULL:
        _train_full(ctx, ds, ident["full_recipe"], _model_key(ident["full"]))
        return True
    if item < FULL:  # ensemble member j: the recipe's full-data model with the member's seed
        j = FULL - 1 - item
        _train_full(ctx, ds, ident["member_recipes"][j], _model_key(ident["members"][j]),
                    what=f"ensemble member {j + 1}/{len(ident['members'])}")
        return True
    from models.kg.evaluation import train_subset

    m = request.m
    index, replicate = (item - m, True) if item >= m else (item, False)
    seed = ident["seeds"][index]
    train_seed = ident["replicate_seeds" if replicate else "train_seeds"][index]
    what = f"replicate of subset model {index + 1}/{m}" if replicate else f"subset model {index + 1}/{m}"
    out = train_subset(ds, _config(_recipe(request.recipe)), request.alpha, seed, ctx.device,
                       _train_progress(ctx, what), ctx.settings.work_dir, train_seed=train_seed)
    buf = io.BytesIO()
    np.savez(buf, mask=out["mask"], outputs=out["outputs"], seed=np.int64(seed), index=np.int64(index),
             train_seed=np.int64(train_seed), seconds=np.float64(out["seconds"]))
    store.put_bytes(buf.getvalue(), _stored_at(ident, m, item))
    return True


def load_ground_truth(settings: Any, lds_key: str, m: int) -> tuple[Any, Any, list[int]]:
    """``(masks [m, n_train] bool, outputs [m, n_test_split], seeds)`` of a stored ground truth."""
    import numpy as np

    store = get_store(settings)
    masks, outputs, seeds = [], [], []
    for i in range(m):
        with np.load(io.BytesIO(store.read_bytes(f"{ROOT}/lds/{lds_key}/subset-{i:05d}.npz"))) as z:
            masks.append(z["mask"])
            outputs.append(z["outputs"])
            seeds.append(int(z["seed"]))
    return np.stack(masks), np.stack(outputs), seeds


class EvaluationPlan(BaseModel):
    """What a fanned-out parent records in its meta (``PLAN_META``) before its shards exist."""

    data_version: str


def _planned(ctx: JobContext, parent: str) -> EvaluationPlan:
    """The plan the parent job recorded (its shards and reduce step check the data against it)."""
    from rq.exceptions import NoSuchJobError
    from rq.job import Job

    try:
        meta = Job.fetch(parent, connection=ctx.job.connection, serializer=ctx.job.serializer).meta
    except NoSuchJobError:
        raise JobError("parent_missing", f"the parent job {parent!r} (which holds the evaluation's plan) is "
                       "gone") from None
    try:
        return EvaluationPlan.model_validate(meta[PLAN_META])
    except (KeyError, ValidationError):
        raise JobError("parent_missing", f"the parent job {parent!r} recorded no evaluation plan") from None


def _same_data(ident: dict[str, Any], plan: EvaluationPlan, request: EvaluateAttributionRequest) -> None:
    if ident["data_version"] != plan.data_version:
        raise JobError("dataset_changed", f"dataset {request.dataset!r} changed since the evaluation started")


def _lds_dataset(ctx: JobContext, request: EvaluateAttributionRequest) -> tuple[Any, dict[str, Any]]:
    ds = _dataset(ctx, request.dataset)
    if len(ds.test) == 0:
        raise JobError("bad_dataset", f"dataset {request.dataset!r} has no test split to evaluate on")
    ident = _identity(request, ds)
    ctx.use_shared([f"{ROOT}/lds/{ident['lds']}", _model_key(ident["full"]),
                    *(_model_key(k) for k in ident["members"])])
    return ds, ident


def run_attribution(request: EvaluateAttributionRequest, ctx: JobContext) -> LdsResult | Planned:
    """The LDS whole when every model it needs is stored; otherwise one shard per missing model, and the reduce
    step computes it."""
    ds, ident = _lds_dataset(ctx, request)
    missing = _missing(ctx, request, ident)
    if not missing:
        result = _finish_lds(ctx, request, ds, ident, 0, None, ctx.artifact_path)
        ctx.artifact_path("result.json").write_text(_result_file(result))
        return result.model_copy(update={"artifacts": _artifacts(ctx.artifacts())})
    ctx.set_meta(PLAN_META, EvaluationPlan(data_version=ident["data_version"]).model_dump())

    def one_model(carried: dict[str, Any], start: int, end: int) -> tuple[dict[str, Any], int, int]:
        # a shard is one missing model: its range is the model's position in _models (see the module docstring)
        return carried, missing[start], missing[start] + 1

    return fan_out(ctx, KIND, request, len(missing), 1, retries=request.shard_retries, max_failed_fraction=0.0,
                   shard_items=one_model)


def run_shard(shard: ShardRequest[EvaluateAttributionRequest], ctx: JobContext) -> dict[str, Any]:
    """Train the models at positions ``[start, end)`` of the evaluation's :func:`_models` (one, as planned)."""
    request = shard.request

    def work() -> dict[str, Any]:
        ds, ident = _lds_dataset(ctx, request)
        _same_data(ident, _planned(ctx, shard.parent), request)
        models = _models(request)
        if shard.end > len(models) or shard.start >= shard.end:
            raise JobError("invalid_payload", f"shard range [{shard.start}, {shard.end}) is not within the "
                           f"evaluation's {len(models)} models")
        items = models[shard.start:shard.end]
        trained = sum(_train_item(ctx, request, ds, ident, item) for item in items)
        return {"items": items, "trained": int(trained)}

    return run_shard_once(ctx, work)


def run_reduce(reduce: ReduceRequest[EvaluateAttributionRequest], ctx: JobContext) -> LdsResult:
    request = reduce.request
    ds, ident = _lds_dataset(ctx, request)
    _same_data(ident, _planned(ctx, reduce.parent), request)
    done = [shard_done(ctx, reduce.parent, i) for i in range(reduce.shards)]
    failed = [i for i, d in enumerate(done) if d is None]
    missing = _missing(ctx, request, ident)
    if missing:
        raise JobError("too_many_failures", f"{len(missing)} of the evaluation's models are missing (shards "
                       f"{failed[:20]} failed): the LDS needs every subset model (and replicate, when asked), the "
                       "full-data model and the ensemble members")
    trainings = sum(int(d["trained"]) for d in done if d is not None)
    out_dir = ctx.settings.work_dir / f"{ctx.job_id}-merged"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = _finish_lds(ctx, request, ds, ident, trainings, Shards(total=reduce.shards, failed=failed),
                             lambda name: out_dir / name)
        (out_dir / "result.json").write_text(_result_file(result))
        store = get_store(ctx.settings)  # the reduce step's files go under the parent's id (what clients ask for)
        store.sync_dir(out_dir, artifacts_key(reduce.parent))
        return result.model_copy(update={"artifacts": _artifacts(store.list_files(artifacts_key(reduce.parent)))})
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _result_file(result: BaseModel) -> str:
    """``result.json``: the result without its file list."""
    return result.model_dump_json(exclude={"artifacts"})


def _artifacts(files: list[dict[str, Any]]) -> list[Any]:
    from core.contract.results.base import Artifact

    return [Artifact.model_validate(f) for f in files]


def _finish_lds(ctx: JobContext, request: EvaluateAttributionRequest, ds: Any, ident: dict[str, Any],
                trainings: int, shards: Shards | None, path_of: Any) -> LdsResult:
    """The estimators' LDS on the stored ground truth (whole or in the reduce step: the same code, the same
    result); its files written at ``path_of(name)``."""
    import numpy as np
    import torch

    from models.kg.evaluation import (
        LDS_DESIGN,
        UNDERPOWERED_RATIO_WIDTH,
        lds_report,
        test_selection,
        underpowered,
    )

    m, seed, names_asked = request.m, request.seed, list(request.estimators)
    masks, outputs, seeds = load_ground_truth(ctx.settings, ident["lds"], m)
    bundle = _load_model(ctx, _model_key(ident["full"]))
    members = [_load_model(ctx, _model_key(key)) for key in ident["members"]]
    sel = test_selection(len(ds.test), request.n_test, seed)
    test = ds.test[torch.from_numpy(sel)]
    names = ds.decode(test)

    def progress(done: int, total: int, message: str) -> None:
        ctx.progress(done, total, "estimators", message=message)

    scores: dict[str, Any] = {}
    try:
        report = lds_report(bundle, masks, outputs[:, sel], test, names_asked, seed, progress=progress,
                            scores=scores, members=members, output=request.output)
    except ValueError as exc:
        raise JobError("estimator_failed", str(exc)) from None
    ceiling = None
    extra: dict[str, Any] = {}
    if request.replicates:
        from models.kg.evaluation import noise_ceiling

        store = get_store(ctx.settings)
        reps = []
        for i in range(m):
            with np.load(io.BytesIO(store.read_bytes(_replicate_key(ident, i)))) as z:
                reps.append(z["outputs"])
        extra["replicate_outputs"] = np.stack(reps)[:, sel]
        ceiling = noise_ceiling(outputs[:, sel], extra["replicate_outputs"], seed)
    np.savez(path_of("ground_truth.npz"), masks=masks, outputs=outputs[:, sel], test_index=sel,
             seeds=np.asarray(seeds, dtype=np.int64), **extra)
    if len(sel) * len(ds.train) <= MAX_SCORE_CELLS:  # the scores behind each LDS, for an independent check
        for name, values in scores.items():
            np.save(path_of(f"scores-{name}.npy"), values)
    write_lds_per_test(path_of("lds_per_test.csv"), names, {e: report[e]["per_test"] for e in names_asked})
    result: dict[str, Any] = {
        "metric": "lds", "dataset": request.dataset, "data_version": ident["data_version"],
        "recipe": _recipe(request.recipe), "m": m, "alpha": request.alpha, "seed": seed,
        "design": LDS_DESIGN, "seeds": seeds, "train_seeds": ident["train_seeds"],
        "replicate_seeds": ident["replicate_seeds"] if request.replicates else None, "n_train": len(ds.train),
        "subset_size": int(masks[0].sum()), "n_test": len(sel),
        "test_triples": names, "output": OUTPUT,
        "ground_truth": {"key": ident["lds"], "full_model": ident["full"], "trainings": trainings,
                         "reused": len(_models(request)) - trainings},
        "noise_ceiling": ceiling,
        "ensemble": {"members": len(members), "seeds": [r["seed"] for r in ident["member_recipes"]],
                     "models": ident["members"]},
        "trainings": trainings,
        "full_model": {"seed": ident["full_recipe"]["seed"], "metrics": _split_metrics(bundle),
                       "checkpoints": [{"name": c.name, "epoch": c.epoch, "lr": c.lr} for c in bundle.checkpoints]},
        "estimators": report,
        "shards": shards,
        "underpowered_width": UNDERPOWERED_RATIO_WIDTH, "warnings": underpowered(report),
    }
    return LdsResult.model_validate(_clean(result))


def write_lds_per_test(path: Path | str, test_triples: list[list[str]], per_test: dict[str, list]) -> None:
    """``lds_per_test.csv`` (tab-separated): each test triple and its LDS under each estimator."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = TableWriter(fh, ["head", "relation", "tail", *per_test], delimiter="\t", lineterminator="\n")
        for j, trip in enumerate(test_triples):
            out.row([*trip, *(values[j] for values in per_test.values())])


def write_corrupted(path: Path | str, indices: list[int], originals: list, corrupted: list) -> None:
    """``corrupted.tsv``: each corrupted training triple, its original tail and the tail put in its place."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = TableWriter(fh, ["train_index", "head", "relation", "original_tail", "corrupted_tail"],
                          delimiter="\t", lineterminator="\n")
        out.rows([i, o[0], o[1], o[2], c[2]] for i, o, c in zip(indices, originals, corrupted, strict=True))


def suspects(scores: Any, triples: list[list[str]], original_tails: dict[int, str],
             limit: int | None = None) -> list[dict[str, Any]]:
    """The training triples by ``scores`` (self-influence, ``suspect_order``: largest first, ties in training
    order), the first ``limit`` (None: all): rank, index, the triple as trained, its score, whether it was
    corrupted and, if so, its original tail (``original_tails``: corrupted index -> that tail)."""
    from models.kg.evaluation import suspect_order

    order = suspect_order(scores)
    if limit is not None:
        order = order[:limit]
    return [{"rank": rank, "train_index": int(i), "triple": list(triples[i]), "self_influence": float(scores[i]),
             "corrupted": int(i) in original_tails, "original_tail": original_tails.get(int(i))}
            for rank, i in enumerate(order.tolist(), 1)]


def write_suspects(path: Path | str, scores: dict[str, Any], triples: list[list[str]],
                   original_tails: dict[int, str]) -> None:
    """``suspects.csv``: every estimator's whole ranking of the training triples (:func:`suspects`), one row per
    (estimator, training triple), best first; columns :data:`SUSPECT_COLUMNS`."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = TableWriter(fh, SUSPECT_COLUMNS)
        for name, values in scores.items():
            out.rows([name, s["rank"], s["train_index"], *s["triple"], s["self_influence"], s["corrupted"],
                      s["original_tail"]] for s in suspects(values, triples, original_tails))


# ------------------------------------------------------------------------------------------------ mislabels
def run_mislabel(request: EvaluateMislabelRequest, ctx: JobContext) -> MislabelResult:
    import numpy as np
    import torch

    from models.kg.evaluation import (
        FULL_MODEL_CHECKPOINTS,
        content_key,
        corrupt_tails,
        data_version,
        mislabel_report,
        with_train,
    )

    ds = _dataset(ctx, request.dataset)
    version = data_version(ds)
    recipe = _recipe(request.recipe)
    key = _model_key(content_key(what="mislabel", recipe=recipe, data=version, fraction=request.fraction,
                                 seed=request.seed, checkpoints=FULL_MODEL_CHECKPOINTS))
    corrupted_train, idx, new_tails = corrupt_tails(ds.train, len(ds.entities), request.fraction, request.seed)
    record = {"indices": idx.tolist(), "original_tails": ds.train[torch.from_numpy(idx), 2].tolist(),
              "new_tails": new_tails.tolist()}
    store = get_store(ctx.settings)
    ctx.use_shared([key])
    trainings = 0
    if not store.exists(f"{key}/config.json"):
        _train_full(ctx, with_train(ds, corrupted_train, keep_eval=True), recipe, key,
                    extra={"corruption.json": record}, what="model of the corrupted graph")
        trainings = 1
    bundle = _load_model(ctx, key)
    stored = json.loads((bundle.path / "corruption.json").read_text())
    if stored != record or not bool((bundle.dataset.train == corrupted_train).all()):
        raise JobError("cache_mismatch", "the stored model of the corrupted graph does not match this request's "
                       "corruption; delete it from the store's cache/evaluation/models/ to train it again")

    def progress(done: int, total: int, message: str) -> None:
        ctx.progress(done, total, "estimators", message=message)

    self_scores: dict[str, Any] = {}
    try:
        report = mislabel_report(bundle, idx, list(request.estimators), progress=progress, scores=self_scores,
                                 seed=request.seed)
    except ValueError as exc:
        raise JobError("estimator_failed", str(exc)) from None
    originals = ds.decode(ds.train[torch.from_numpy(idx)])
    corrupted = bundle.dataset.decode(corrupted_train[torch.from_numpy(idx)])
    write_corrupted(ctx.artifact_path("corrupted.tsv"), idx.tolist(), originals, corrupted)
    listed = [{"train_index": i, "original": o, "corrupted": c}
              for i, o, c in list(zip(idx.tolist(), originals, corrupted, strict=True))[:MAX_LISTED_CORRUPTED]]
    np.savez(ctx.artifact_path("self_scores.npz"), **self_scores)  # the scores behind each ranking
    trained = bundle.dataset.decode(corrupted_train)  # every training triple as the model saw it
    original_tails = {i: o[2] for i, o in zip(idx.tolist(), originals, strict=True)}
    write_suspects(ctx.artifact_path("suspects.csv"), self_scores, trained, original_tails)
    for name, values in self_scores.items():
        report[name]["suspects"] = suspects(values, trained, original_tails, MAX_LISTED_SUSPECTS)
    write_jsonl(ctx.artifact_path("recall_curves.jsonl"),
                ({"estimator": n, **r["recall_curve"]} for n, r in report.items()))
    result = MislabelResult.model_validate(_clean({
        "metric": "mislabel", "dataset": request.dataset, "data_version": version, "recipe": recipe,
        "fraction": request.fraction, "seed": request.seed, "n_train": len(ds.train),
        "n_corrupted": int(len(idx)), "corrupted": listed, "corrupted_listed": len(listed),
        "trainings": trainings, "model": {"key": key.rsplit("/", 1)[-1]}, "model_metrics": _split_metrics(bundle),
        "suspects_listed": min(MAX_LISTED_SUSPECTS, len(ds.train)), "estimators": report,
    }))
    ctx.artifact_path("result.json").write_text(_result_file(result))
    return result.model_copy(update={"artifacts": _artifacts(ctx.artifacts())})
