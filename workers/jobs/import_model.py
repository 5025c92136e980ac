"""Worker side of ``POST /models/import``: check a model trained elsewhere against its config, convert it into
this project's model directory, smoke-test it and register it for the job's owner.

A Hugging Face checkpoint is inspected again as data (the directory may have changed since the API checked it),
only the files loading reads are copied to a staging directory (config.json, the safetensors weights and index,
the tokenizer's JSON files: never a pickle or anything else the directory holds), and the copy is loaded with
:func:`models.hf.checkpoint.load` (``trust_remote_code=False``, safetensors only), smoke-tested and registered.
An exported program is checked again as data, its archive copied and its checked spec written beside it, and it
is built by :mod:`models.export.program` (the service's own interpreter), dry-run and smoke-tested."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from core.contract.errors import FieldError
from core.kinds.import_model import (
    PACKAGED_ENCODERS,
    REGISTRY_KIND,
    WEIGHT_DEFAULTS,
    ImportModelRequest,
    ImportResult,
    checked_dir,
    inspect_export,
    inspect_hf,
    pretrained_problem,
)
from core.userfiles import UserFileError, UserFiles, display
from models.bounded_load import LoadBounds
from models.files import LOCAL, read_bytes
from workers.context import JobContext, JobError
from workers.context import json_safe as _clean

LOADERS = {"conve": "models.kg.checkpoint:load", "nrms": "models.news.checkpoint:load",
           "naml": "models.news.checkpoint:load", "vision_bdh": "models.vision.checkpoint:load",
           "huggingface": "models.hf.checkpoint:load", "export": "models.export.program:load"}
HF_SMOKE_TEXTS = ["a good one", "not bad at all", "the worst"]
MAX_MESSAGE = 500


def _weights(src: Path, given: str | None) -> str:
    return given or next(w for w in WEIGHT_DEFAULTS if (src / w).is_file())


def _config(src: Path, given: dict[str, Any] | None, settings: Any = None) -> dict[str, Any]:
    if given is not None:
        return dict(given)
    files = UserFiles(settings) if settings is not None else LOCAL
    config = json.loads(read_bytes(files, src / "config.json", "json"))
    if not isinstance(config, dict):
        raise ValueError("config.json does not hold a JSON object")
    return config


def _import_news(src: Path, out: Path, request: ImportModelRequest, settings: Any) -> dict[str, Any]:
    import torch

    from models.news import checkpoint
    from models.news.modules import build_model
    from models.news.text import WordTokenizer
    from models.weight_files import check_state, load_state_file, strip_prefix

    config = _config(src, request.config, settings)
    config.pop("meta", None)
    config["kind"] = request.kind
    problem = pretrained_problem(src, config.get("pretrained"))
    if problem:
        raise JobError("invalid_model", f"config.pretrained: {problem}")
    if config.get("pretrained") not in (None, *PACKAGED_ENCODERS):  # an encoder inside the model directory
        config["pretrained"] = str((src / config["pretrained"]).resolve())
    vocab = src / (request.vocab or "vocab.json")
    tokenizer = WordTokenizer.load(vocab) if vocab.is_file() else None
    if request.kind == "naml" or config.get("encoder") == "word":
        if tokenizer is None:
            raise JobError("invalid_model", "vocab: a word-embedding model needs its vocabulary (vocab.json)")
    elif config.get("encoder") != "bert":
        raise JobError("invalid_model", "config.encoder: NRMS needs 'bert' or 'word'")
    try:
        model = build_model(config, tokenizer)
    except (ValueError, OSError, KeyError) as exc:
        raise JobError("invalid_model", f"config: {exc}") from None
    weights = _weights(src, request.weights)
    state = strip_prefix(load_state_file(src / weights, bounds=LoadBounds.of(settings),
                                         shown=display(settings, src / weights)))
    frozen = checkpoint.frozen_bert(model)
    check_state(model, state, weights, (checkpoint.FROZEN_PREFIX,) if frozen else ())
    model.load_state_dict(state, strict=False)
    model.eval()
    checkpoint.save(model, out, meta={"imported_from": src.name})
    with torch.no_grad():
        scores = model.score_texts(["Team wins the championship final", "New phone released with faster chip"],
                                   ["Coach praises defense after the game", "Senate passes the budget bill"])
    return {"parameters": sum(t.numel() for t in model.parameters()),
            "smoke": {"scores": [float(s) for s in scores], "finite": bool(torch.isfinite(scores).all())}}


def _import_bdh(src: Path, out: Path, request: ImportModelRequest, settings: Any) -> dict[str, Any]:
    import torch

    from models.vision.bdh import VisionBDH
    from models.vision.checkpoint import save_model_dir
    from models.vision.config import Optimizations, VisionBDHConfig
    from models.weight_files import check_state, load_state_file, strip_prefix

    raw = _config(src, request.config, settings)
    model_cfg = raw.get("model", raw)
    try:
        config = VisionBDHConfig.from_dict(model_cfg)
    except (TypeError, ValueError, KeyError) as exc:
        raise JobError("invalid_model", f"config: {exc}") from None
    model = VisionBDH(config, Optimizations())
    weights = _weights(src, request.weights)
    state = strip_prefix(load_state_file(src / weights, bounds=LoadBounds.of(settings),
                                         shown=display(settings, src / weights)))
    check_state(model, state, weights)
    model.load_state_dict(state)
    model.eval()
    meta = {k: v for k, v in raw.items() if k != "model"} if "model" in raw else {}
    save_model_dir(out, model, config, meta)
    with torch.no_grad():
        x = torch.randn(2, config.in_channels, config.img_size, config.img_size, generator=torch.Generator()
                        .manual_seed(0))
        logits = model(x)
    return {"parameters": sum(t.numel() for t in model.parameters()),
            "smoke": {"logits_shape": list(logits.shape), "finite": bool(torch.isfinite(logits).all())}}


def _copy_checkpoint_file(files: UserFiles, src: Path, name: str, out: Path) -> None:
    """One file of the checkpoint, read through the user-file opener (inside the roots, a regular file, bounded)."""
    from models.hf.files import TOKENIZER

    fmt = "tokenizer" if name == TOKENIZER else "safetensors" if name.endswith(".safetensors") else "json"
    with files.open(src / name, fmt) as fh, open(out / name, "wb") as dst:
        shutil.copyfileobj(fh, dst, 1 << 20)


def _import_huggingface(src: Path, out: Path, request: ImportModelRequest, settings: Any) -> dict[str, Any]:
    import torch

    from models.hf import checkpoint

    try:
        info = inspect_hf(settings, src, request.path)
    except FieldError as exc:
        raise JobError("invalid_model", exc.message) from None
    files = UserFiles(settings)
    out.mkdir(parents=True, exist_ok=True)
    for name in info.files:
        try:
            _copy_checkpoint_file(files, src, name, out)
        except (UserFileError, OSError) as exc:
            raise JobError("invalid_model", str(exc) if isinstance(exc, UserFileError) else
                           f"{display(settings, src / name)} cannot be read ({exc.strerror or exc})") from None
    try:
        model = checkpoint.load(out, "cpu")
        logits = model.logits(HF_SMOKE_TEXTS)
    except Exception as exc:  # whatever transformers raises on a checkpoint it cannot build
        text = str(exc).replace(str(out), display(settings, src)).strip().splitlines()
        message = text[0] if text else type(exc).__name__
        raise JobError("invalid_model", f"the checkpoint does not load with transformers: "
                       f"{message[:MAX_MESSAGE]}") from None
    labels = model.labels
    shape = list(logits.shape)
    finite = bool(torch.isfinite(logits).all())
    if shape != [len(HF_SMOKE_TEXTS), len(labels)]:
        raise JobError("invalid_model", f"the classifier gives {shape[-1]} logits per text but config.json names "
                       f"{len(labels)} labels (id2label)")
    if not finite:
        raise JobError("invalid_model", "the classifier's logits of a few words are not finite (NaN or infinite "
                       "weights?)")
    smoke = {"texts": len(HF_SMOKE_TEXTS), "logits_shape": shape, "finite": finite}
    described = {"model_type": info.model_type, "architecture": info.architecture, "task": info.task,
                 "labels": labels}
    return {"parameters": model.parameters, "smoke": smoke, **described,
            "meta": {**described, "source": display(settings, src), "dims": checkpoint.dims(model)}}


def _import_export(src: Path, out: Path, request: ImportModelRequest, settings: Any) -> dict[str, Any]:
    """Check the archive and spec again (the directory may have changed), copy the archive through the user-file
    opener and write the checked spec beside it, then build the program with the service's interpreter (no code
    from the file), dry-run it and smoke-test two inputs."""
    import torch

    from models.export import program

    try:
        _, spec = inspect_export(settings, src, request)
    except FieldError as exc:
        raise JobError("invalid_model", exc.message) from None
    out.mkdir(parents=True, exist_ok=True)
    name = request.weights or "model.pt2"
    try:
        with UserFiles(settings).open(src / name, "program") as fh, open(out / program.PROGRAM_FILE, "wb") as dst:
            shutil.copyfileobj(fh, dst, 1 << 20)
    except (UserFileError, OSError) as exc:
        raise JobError("invalid_model", str(exc) if isinstance(exc, UserFileError) else
                       f"{display(settings, src / name)} cannot be read ({exc.strerror or exc})") from None
    (out / program.SPEC_FILE).write_text(json.dumps(spec.to_json()))
    if spec.tokens is not None and spec.tokens.words is not None:  # the checked vocabulary, as the spec names it
        from models.export.spec import VOCABULARY_FILE

        (out / VOCABULARY_FILE).write_text("\n".join(spec.tokens.words) + "\n", encoding="utf-8")
    try:
        clf = program.load(out, "cpu")
        elements = clf.elements_per_example
        x = torch.stack([torch.zeros(spec.shape), torch.ones(spec.shape)])
        logits = clf.logits(x)
    except (ValueError, RuntimeError) as exc:
        raise JobError("invalid_model", f"the program does not run: {str(exc)[:MAX_MESSAGE]}") from None
    shape = list(logits.shape)
    finite = bool(torch.isfinite(logits).all())
    if not finite:
        raise JobError("invalid_model", "the program's logits of a zero and a ones input are not finite (NaN or "
                       "infinite weights?)")
    described = {"labels": spec.labels, "spec": spec.to_json(), "operators": clf.info.operators}
    return {"parameters": clf.parameters, "smoke": {"logits_shape": shape, "finite": finite,
                                                   "elements_per_example": elements},
            **described, "meta": {"labels": spec.labels, "spec": spec.to_json(), "elements_per_example": elements,
                                  "source": display(settings, src)}}


def run(request: ImportModelRequest, ctx: JobContext) -> ImportResult:
    from models.bounded_load import LoadRefused
    from models.weight_files import StateMismatch

    r = request
    try:
        src = checked_dir(ctx.settings, r.path)
    except FieldError as exc:
        raise JobError("invalid_model", exc.message) from None
    out = ctx.settings.work_dir / f"import-{ctx.job_id}"
    ctx.progress(0, 2, "steps", message="checking names and shapes")
    try:
        if r.kind == "conve":
            from models.kg.importer import ImportError_, import_conve

            # the importer's spec: the request's fields (checkpoints as {file, lr, epoch}), the files defaulted
            spec = {**r.model_dump(), "weights": _weights(src, r.weights),
                    "train_triples": r.train_triples or "train.txt", "dataset_name": r.name}
            try:
                report = import_conve(src, out, spec, LoadBounds.of(ctx.settings), display(ctx.settings, src))
            except ImportError_ as exc:
                raise JobError("invalid_model", str(exc)) from None
        elif r.kind in ("nrms", "naml"):
            report = _import_news(src, out, r, ctx.settings)
        elif r.kind == "vision_bdh":
            report = _import_bdh(src, out, r, ctx.settings)
        elif r.kind == "export":
            report = _import_export(src, out, r, ctx.settings)
        else:
            report = _import_huggingface(src, out, r, ctx.settings)
        ctx.progress(1, 2, "steps", message="registering")
        ctx.register_model(r.name, kind=REGISTRY_KIND[r.kind], loader=LOADERS[r.kind], path=out,
                           parameters=report["parameters"],
                           meta=_clean({"imported": True, "architecture": r.kind, "source": r.path,
                                        "smoke": report.get("smoke"), **report.pop("meta", {})}))
    except StateMismatch as exc:
        raise JobError("shape_mismatch", str(exc)) from None
    except LoadRefused as exc:  # a bounded load past its memory, CPU or time (models/bounded_load.py)
        raise JobError(exc.code, str(exc)) from None
    except ValueError as exc:
        raise JobError("invalid_model", str(exc)) from None
    finally:
        shutil.rmtree(out, ignore_errors=True)
    ctx.progress(2, 2, "steps", message="registered")
    return ImportResult.model_validate(_clean({"model": r.name, "kind": r.kind,
                                               "registry_kind": REGISTRY_KIND[r.kind], **report}))
