"""Worker side of ``POST /evaluate/attribution`` and ``POST /evaluate/mislabel`` (the maths:
``models/kg/evaluation.py``).

What an evaluation trains is kept in the store, content-addressed, and reused by every later evaluation that asks
for the same thing (whoever asks: the address is a digest of the data itself, so only a caller who holds the same
data can reach it):

- ``cache/evaluation/models/<digest>/``: a ConvE model directory, the full-data model of a recipe and a data
  version (the model the estimators run on; an ensemble member is the full-data model of the recipe with another
  seed, so it has the same address as that recipe's full-data model), or, for mislabel detection, the model of the
  corrupted graph (its ``corruption.json`` records the corrupted triples);
- ``cache/evaluation/lds/<digest>/subset-<i>.npz``: subset model ``i`` of a (recipe, data version, alpha, m,
  seed) ground truth: its mask over the training triples, its outputs (margins) on the whole test split, its seed;
  ``replicate-<i>.npz`` the same for its replicate (the same subset trained with another seed), when an evaluation
  asked for the noise ceiling (``replicates``).

An LDS evaluation whose ground truth is complete runs as one job (no training). Otherwise it fans out one shard per
missing model (the subset models and their replicates when asked for, the full-data model and the ensemble members
the ensemble estimators need), and its reduce step computes the estimators' LDS. ``trainings`` in the result counts
the models this evaluation trained.
"""

from __future__ import annotations

import io
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from core.artifacts import artifacts_key
from core.filestore import StoreError, get_store
from workers.context import JobContext, JobError
from workers.context import json_safe as _clean
from workers.fanout import fan_out, shard_done, write_jsonl
from workers.fanout import run_shard as run_shard_once

ROOT = "cache/evaluation"
FULL = -1  # the item of the full-data model in a fan-out's item list; ensemble member i is item -2 - i, the
# replicate of subset model i (same subset, another seed; ``replicates``) is item m + i
OUTPUT = ("margin of the true tail on the tail query (h, r, ?): s_t - logsumexp_{e != t} s_e (TRAK's multi-class "
          "margin), model in eval mode")
MAX_SCORE_CELLS = 4_000_000  # scores-<estimator>.npy is written when n_test x n_train is at most this
MAX_LISTED_CORRUPTED = 10_000  # corrupted triples listed in the result (all of them in corrupted.tsv)


# ------------------------------------------------------------------------------------------------ shared
def _dataset(ctx: JobContext, name: str) -> Any:
    from core.kinds.base import FieldError
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


def _publish(ctx: JobContext, parent: str, out_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """A reduce step's files go under the parent's id (what clients ask for)."""
    (out_dir / "result.json").write_text(json.dumps(_clean(result)))
    store = get_store(ctx.settings)
    store.sync_dir(out_dir, artifacts_key(parent))
    return {**result, "artifacts": store.list_files(artifacts_key(parent))}


# ------------------------------------------------------------------------------------------------ LDS
def _member_recipes(payload: dict[str, Any]) -> list[dict[str, Any]]:
    from core.kinds.evaluate import ensemble_members
    from models.kg.evaluation import member_seeds

    recipe = payload["recipe"]
    k = ensemble_members(payload["estimators"], payload.get("ensemble", 0))
    return [{**recipe, "seed": s} for s in member_seeds(int(recipe.get("seed", 0)), k)]


def _identity(payload: dict[str, Any], ds: Any) -> dict[str, Any]:
    from models.kg.evaluation import content_key, data_version, subset_seeds

    version = data_version(ds)
    recipe = payload["recipe"]
    members = _member_recipes(payload)
    return {"data_version": version,
            "full": content_key(what="full", recipe=recipe, data=version),
            "members": [content_key(what="full", recipe=r, data=version) for r in members],
            "member_recipes": members,
            "lds": content_key(what="lds", recipe=recipe, data=version, alpha=payload["alpha"], m=payload["m"],
                               seed=payload["seed"]),
            "seeds": subset_seeds(payload["seed"], payload["m"])}


def _subset_key(ident: dict[str, Any], i: int) -> str:
    return f"{ROOT}/lds/{ident['lds']}/subset-{i:05d}.npz"


def _replicate_key(ident: dict[str, Any], i: int) -> str:
    return f"{ROOT}/lds/{ident['lds']}/replicate-{i:05d}.npz"


def _missing(ctx: JobContext, ident: dict[str, Any], m: int, replicates: bool = False) -> list[int]:
    store = get_store(ctx.settings)
    items = [i for i in range(m) if not store.exists(_subset_key(ident, i))]
    if replicates:
        items += [m + i for i in range(m) if not store.exists(_replicate_key(ident, i))]
    if not store.exists(f"{_model_key(ident['full'])}/config.json"):
        items.append(FULL)
    items += [FULL - 1 - j for j, key in enumerate(ident["members"])
              if not store.exists(f"{_model_key(key)}/config.json")]
    return items


def _train_item(ctx: JobContext, payload: dict[str, Any], ds: Any, ident: dict[str, Any], item: int) -> bool:
    """Train one missing model of the evaluation (False when another job stored it meanwhile)."""
    import numpy as np

    store = get_store(ctx.settings)
    if item == FULL:
        key = _model_key(ident["full"])
        if store.exists(f"{key}/config.json"):
            return False
        _train_full(ctx, ds, payload["recipe"], key)
        return True
    if item < FULL:  # ensemble member j: the recipe's full-data model with the member's seed
        j = FULL - 1 - item
        key = _model_key(ident["members"][j])
        if store.exists(f"{key}/config.json"):
            return False
        _train_full(ctx, ds, ident["member_recipes"][j], key,
                    what=f"ensemble member {j + 1}/{len(ident['members'])}")
        return True
    from models.kg.evaluation import replicate_seed, train_subset

    m = payload["m"]
    index, replicate = (item - m, True) if item >= m else (item, False)
    key = _replicate_key(ident, index) if replicate else _subset_key(ident, index)
    if store.exists(key):
        return False
    seed = ident["seeds"][index]
    train_seed = replicate_seed(seed) if replicate else seed
    what = f"replicate of subset model {index + 1}/{m}" if replicate else f"subset model {index + 1}/{m}"
    out = train_subset(ds, _config(payload["recipe"]), payload["alpha"], seed, ctx.device,
                       _train_progress(ctx, what), ctx.settings.work_dir, train_seed=train_seed)
    buf = io.BytesIO()
    np.savez(buf, mask=out["mask"], outputs=out["outputs"], seed=np.int64(seed), index=np.int64(index),
             train_seed=np.int64(train_seed), seconds=np.float64(out["seconds"]))
    store.put_bytes(buf.getvalue(), key)
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


def run_attribution(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    ds = _dataset(ctx, payload["dataset"])
    if len(ds.test) == 0:
        raise JobError("bad_dataset", f"dataset {payload['dataset']!r} has no test split to evaluate on")
    ident = _identity(payload, ds)
    missing = _missing(ctx, ident, payload["m"], payload.get("replicates", False))
    if not missing:
        result = _finish_lds(ctx, payload, ds, ident, 0, ctx.artifact_path)
        ctx.artifact_path("result.json").write_text(json.dumps(result))
        return {**result, "artifacts": ctx.artifacts()}
    request = {**payload, "items": missing, "data_version": ident["data_version"]}

    def shard_payload(index: int, start: int, end: int) -> dict[str, Any]:
        return {"parent": ctx.job_id, "index": index, "start": start, "end": end, "request": request}

    return fan_out(ctx, shard_kind="evaluate_attribution_shard", reduce_kind="evaluate_attribution_reduce",
                   request=request, n_items=len(missing), shard_size=1, unit="models", shard_payload=shard_payload,
                   timeout_s=12 * 3600, retries=payload.get("shard_retries", 1), max_failed_fraction=0.0)


def _same_data(ds: Any, request: dict[str, Any]) -> dict[str, Any]:
    ident = _identity(request, ds)
    if ident["data_version"] != request["data_version"]:
        raise JobError("dataset_changed", f"dataset {request['dataset']!r} changed since the evaluation started")
    return ident


def run_shard(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Train the models ``items[start:end]`` of the parent's evaluation (a subset index i < m, m + i: subset i's
    replicate, -1: the full data, or -2 - j: ensemble member j)."""
    request = payload["request"]

    def work() -> dict[str, Any]:
        ds = _dataset(ctx, request["dataset"])
        ident = _same_data(ds, request)
        items = request["items"][payload["start"]:payload["end"]]
        trained = sum(_train_item(ctx, request, ds, ident, item) for item in items)
        return {"items": items, "trained": int(trained)}

    return run_shard_once(ctx, work)


def run_reduce(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    parent, request = payload["parent"], payload["request"]
    ds = _dataset(ctx, request["dataset"])
    ident = _same_data(ds, request)
    done = [shard_done(ctx, parent, i) for i in range(payload["shards"])]
    missing = _missing(ctx, ident, request["m"], request.get("replicates", False))
    if missing:
        failed = [i for i, d in enumerate(done) if d is None]
        raise JobError("too_many_failures", f"{len(missing)} of the evaluation's models are missing (shards "
                       f"{failed[:20]} failed): the LDS needs every subset model (and replicate, when asked), the "
                       "full-data model and the ensemble members")
    trainings = sum(int(d.get("trained", 0)) for d in done if d and not d.get("reused"))
    out_dir = ctx.settings.work_dir / f"{ctx.job_id}-merged"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = _finish_lds(ctx, request, ds, ident, trainings, lambda name: out_dir / name)
        return _publish(ctx, parent, out_dir, result)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _finish_lds(ctx: JobContext, payload: dict[str, Any], ds: Any, ident: dict[str, Any], trainings: int,
                path_of: Any) -> dict[str, Any]:
    """The estimators' LDS on the stored ground truth; its files written at ``path_of(name)``."""
    import numpy as np
    import torch

    from models.kg.evaluation import lds_report, test_selection

    masks, outputs, seeds = load_ground_truth(ctx.settings, ident["lds"], payload["m"])
    bundle = _load_model(ctx, _model_key(ident["full"]))
    members = [_load_model(ctx, _model_key(key)) for key in ident["members"]]
    sel = test_selection(len(ds.test), payload["n_test"], payload["seed"])
    test = ds.test[torch.from_numpy(sel)]
    names = ds.decode(test)

    def progress(done: int, total: int, message: str) -> None:
        ctx.progress(done, total, "estimators", message=message)

    scores: dict[str, Any] = {}
    try:
        report = lds_report(bundle, masks, outputs[:, sel], test, payload["estimators"], payload["seed"],
                            progress=progress, scores=scores, members=members)
    except ValueError as exc:
        raise JobError("estimator_failed", str(exc)) from None
    ceiling = None
    extra: dict[str, Any] = {}
    if payload.get("replicates"):
        from models.kg.evaluation import noise_ceiling

        store = get_store(ctx.settings)
        reps = []
        for i in range(payload["m"]):
            with np.load(io.BytesIO(store.read_bytes(_replicate_key(ident, i)))) as z:
                reps.append(z["outputs"])
        extra["replicate_outputs"] = np.stack(reps)[:, sel]
        ceiling = noise_ceiling(outputs[:, sel], extra["replicate_outputs"], payload["seed"])
    np.savez(path_of("ground_truth.npz"), masks=masks, outputs=outputs[:, sel], test_index=sel,
             seeds=np.asarray(seeds, dtype=np.int64), **extra)
    if len(sel) * len(ds.train) <= MAX_SCORE_CELLS:  # the scores behind each LDS, for an independent check
        for name, values in scores.items():
            np.save(path_of(f"scores-{name}.npy"), values)
    with open(path_of("lds_per_test.csv"), "w", encoding="utf-8") as fh:
        fh.write("head\trelation\ttail\t" + "\t".join(payload["estimators"]) + "\n")
        for j, trip in enumerate(names):
            vals = [report[e]["per_test"][j] for e in payload["estimators"]]
            fh.write("\t".join(trip) + "\t" + "\t".join("" if v is None else repr(v) for v in vals) + "\n")
    result: dict[str, Any] = {
        "metric": "lds", "dataset": payload["dataset"], "data_version": ident["data_version"],
        "recipe": payload["recipe"], "m": payload["m"], "alpha": payload["alpha"], "seed": payload["seed"],
        "seeds": seeds, "n_train": len(ds.train), "subset_size": int(masks[0].sum()), "n_test": len(sel),
        "test_triples": names, "output": OUTPUT,
        "ground_truth": {"key": ident["lds"], "full_model": ident["full"], "trainings": trainings,
                         "reused": payload["m"] * (2 if ceiling else 1) + 1 + len(members) - trainings},
        "noise_ceiling": ceiling,
        "ensemble": {"members": len(members), "seeds": [r["seed"] for r in ident["member_recipes"]],
                     "models": ident["members"]},
        "trainings": trainings,
        "full_model": {"metrics": {k: v for k, v in (bundle.metrics or {}).items() if k in ("valid", "test")},
                       "checkpoints": [{"name": c.name, "epoch": c.epoch, "lr": c.lr} for c in bundle.checkpoints]},
        "estimators": report,
    }
    return _clean(result)


# ------------------------------------------------------------------------------------------------ mislabels
def run_mislabel(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    import numpy as np
    import torch

    from models.kg.evaluation import content_key, corrupt_tails, data_version, mislabel_report, with_train

    ds = _dataset(ctx, payload["dataset"])
    version = data_version(ds)
    key = _model_key(content_key(what="mislabel", recipe=payload["recipe"], data=version,
                                 fraction=payload["fraction"], seed=payload["seed"]))
    corrupted_train, idx, new_tails = corrupt_tails(ds.train, len(ds.entities), payload["fraction"],
                                                    payload["seed"])
    record = {"indices": idx.tolist(), "original_tails": ds.train[torch.from_numpy(idx), 2].tolist(),
              "new_tails": new_tails.tolist()}
    store = get_store(ctx.settings)
    trainings = 0
    if not store.exists(f"{key}/config.json"):
        _train_full(ctx, with_train(ds, corrupted_train, keep_eval=True), payload["recipe"], key,
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
        report = mislabel_report(bundle, idx, payload["estimators"], progress=progress, scores=self_scores)
    except ValueError as exc:
        raise JobError("estimator_failed", str(exc)) from None
    originals = ds.decode(ds.train[torch.from_numpy(idx)])
    corrupted = bundle.dataset.decode(corrupted_train[torch.from_numpy(idx)])
    with open(ctx.artifact_path("corrupted.tsv"), "w", encoding="utf-8") as fh:
        fh.write("train_index\thead\trelation\toriginal_tail\tcorrupted_tail\n")
        for i, o, c in zip(idx.tolist(), originals, corrupted, strict=True):
            fh.write(f"{i}\t{o[0]}\t{o[1]}\t{o[2]}\t{c[2]}\n")
    listed = [{"train_index": i, "original": o, "corrupted": c}
              for i, o, c in list(zip(idx.tolist(), originals, corrupted, strict=True))[:MAX_LISTED_CORRUPTED]]
    np.savez(ctx.artifact_path("self_scores.npz"), **self_scores)  # the scores behind each ranking
    write_jsonl(ctx.artifact_path("recall_curves.jsonl"),
                ({"estimator": n, **r["recall_curve"]} for n, r in report.items()))
    result = {
        "metric": "mislabel", "dataset": payload["dataset"], "data_version": version, "recipe": payload["recipe"],
        "fraction": payload["fraction"], "seed": payload["seed"], "n_train": len(ds.train),
        "n_corrupted": int(len(idx)), "corrupted": listed, "corrupted_listed": len(listed),
        "trainings": trainings, "model": {"key": key.rsplit("/", 1)[-1]},
        "model_metrics": {k: v for k, v in (bundle.metrics or {}).items() if k in ("valid", "test")},
        "estimators": report,
    }
    ctx.artifact_path("result.json").write_text(json.dumps(_clean(result)))
    return {**_clean(result), "artifacts": ctx.artifacts()}
