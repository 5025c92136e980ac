"""``POST /tracin``: TracIn-CP influence of training triples on ConvE predictions (no torch here).

Validation reads the model directory's id dictionaries and config (plain text), so an unknown entity, relation,
checkpoint or layer is a 422 naming the field and value before anything is queued.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from core import estimators, limits
from core.bounded import run_bounded
from core.contract.checks import require_model
from core.contract.errors import FieldError
from core.contract.fields import (
    ADVANCED,
    JobRequest,
    RequestModel,
    ShardSize,
    max_failed_field,
    shard_retries_field,
    shard_size_field,
)
from core.contract.kind import FanOut, JobKind, register
from core.fanout import too_many_shards
from core.parsers import raise_if_store_down
from core.settings import Settings
from core.userfiles import PathError, display, resolve_data_path
from models.kg import trak_config
from models.kg.shapes import LAYER_NAMES

MAX_TEST_TRIPLES = limits.MAX_TEST_TRIPLES
MAX_SINGLE_PAIRS = limits.MAX_SINGLE_PAIRS  # mode 'single' returns every pair
Name = Annotated[str, StringConstraints(min_length=1, max_length=limits.MAX_TRIPLE_NAME_LENGTH)]
Triple = Annotated[list[Name], Field(min_length=3, max_length=3, description="[head, relation, tail] by name")]
# the gradient selection TracIn and the feature store share: which checkpoints, which layers, whose gradient
Checkpoints = Literal["all"] | Annotated[list[Name], Field(min_length=1, max_length=limits.MAX_CHECKPOINTS)]
Layers = Literal["all", "last"] | Annotated[list[Name], Field(min_length=1, max_length=limits.MAX_LAYERS)]
Loss = Literal["train", "score_bce", "margin"]
# The default loss of estimator 'tracin': of the two the exact path was measured with, the one whose scores take
# both signs where either's do (the training loss's were never negative on the shipped graphs) and whose
# self-influence finds mislabelled triples (docs/tracin.md, "Which loss, and why"; benchmarks/tracin_loss.py).
# The estimators over stored features default to what POST /featurize stores by default, the evaluated TRAK's
# features (models.kg.trak_config: the margin, the evaluated k, seed 0), and 'trak' to the evaluated damping, so
# that a default featurize job and a default 'trak' query run the configuration the evaluations measured.
DEFAULT_LOSS = "score_bce"
STORED_DEFAULT_LOSS = trak_config.TRAK_LOSS
# the estimators a query answers with (core.estimators: one registry, one meaning per name)
QueryEstimator = estimators.choices(query=True)


class FilterRequest(RequestModel):
    n_hops: int = Field(1, ge=1, le=limits.MAX_HOPS, title="Neighbourhood hops",
        description="Keep training triples within this many hops of a test triple's entities")
    min_degree: int = Field(0, ge=0, le=limits.MAX_MIN_DEGREE, title="Minimum entity degree",
        description="Drop training triples whose entities appear in fewer triples than this")
    preserve_test_entities: bool = Field(True, title="Keep the test entities' triples",
        description="Always keep the training triples that touch a test triple's entities")


class TracInRequest(JobRequest):
    model: str = Field(..., min_length=1, max_length=limits.MAX_NAME_LENGTH, title="Knowledge-graph model",
        description="The ConvE model whose predictions are explained")
    test_triples: list[Triple] | None = Field(
        None, min_length=1, max_length=MAX_TEST_TRIPLES, title="Predictions to explain",
        description="The predictions to explain, each a head, relation and tail; not needed for self-influence")
    test_triples_path: str | None = Field(
        None, min_length=1, max_length=limits.MAX_PATH_LENGTH, title="Test triples file", json_schema_extra=ADVANCED,
        description=("Instead of typing them: a TSV file of head, relation and tail under the data roots, read once at"
                     " submission"))
    mode: Literal["test", "self", "single"] = Field("test", title="What to compute",
        description=("'test': the training triples that most help or hurt each test triple; 'self': every training "
                     "triple's influence on itself; 'single': the influence of the listed training triples only"))
    top_k: int | None = Field(10, ge=0, le=limits.MAX_TRACIN_TOP_K, title="Triples listed",
        description=("How many most helpful and most harmful training triples each test triple lists; empty writes "
                     f"every score to a file. At most {limits.MAX_TRACIN_LISTED:,} listed in all (test triples x "
                     "this)"))
    checkpoints: Checkpoints = Field(
        "all", title="Checkpoints summed", json_schema_extra=ADVANCED,
        description="'all', or the checkpoints to sum over (file names or epochs)")
    layers: Layers = Field(
        "all", title="Layers compared", json_schema_extra=ADVANCED,
        description="'all', 'last', or the layers whose gradients are compared")
    loss: Loss | None = Field(
        None, title="Gradient of", json_schema_extra=ADVANCED,
        description=("Whose gradients are compared: the binary cross-entropy of the triple's own score "
                     "('score_bce': on some graphs its influences take both signs, where the training loss's were never "
                     "negative on the shipped graphs), the training loss ('train') or the negated margin of the tail "
                     "query ('margin', TRAK's output function, what the attribution-quality evaluations measure); "
                     "empty: 'score_bce' for estimator 'tracin', 'margin' (what POST /featurize stores by default, "
                     "the evaluated TRAK's) for the stored-feature estimators"))
    projection_dim: int | None = Field(
        None, ge=1, le=limits.MAX_PROJECTION_DIM, title="Random projection size", json_schema_extra=ADVANCED,
        description=("Project the gradients to this many dimensions (faster, approximate); empty: exact for "
                     "estimator 'tracin', and for the stored-feature estimators the evaluated TRAK's k for the "
                     "model's training triples (what POST /featurize stores by default)"))
    precision: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto", title="Numeric precision", json_schema_extra=ADVANCED,
        description="Floating-point format of the passes; 'auto' is fp32 (fp16 underflows ConvE's gradients)")
    batch_size: int = Field(
        256, ge=1, le=limits.MAX_TRACIN_BATCH_SIZE, title="Training triples per pass", json_schema_extra=ADVANCED,
        description="Candidate training triples scored together")
    filter: FilterRequest | None = Field(None, title="Candidate filter", json_schema_extra=ADVANCED,
        description="Score only the training triples near the test triples")
    train_triples: list[Triple] | None = Field(
        None, min_length=1, max_length=limits.MAX_SINGLE_TRAIN_TRIPLES, title="Training triples to score",
        description="For 'single': the training triples whose influence is computed")
    lr_weight: Literal["last", "interval"] = Field(
        "last", title="Checkpoint weight", json_schema_extra=ADVANCED,
        description=("'last': the learning rate saved with each checkpoint; 'interval': the sum of the rates since the"
                     " previous checkpoint"))
    method: Literal["ghost", "vmap"] = Field(
        "ghost", title="Gradient method", json_schema_extra=ADVANCED,
        description=("'ghost' computes the dot products in factored form (fast); 'vmap' materialises per-example "
                     "gradients (the slow reference)"))
    estimator: QueryEstimator = Field(
        "tracin", title="Influence estimator", json_schema_extra=ADVANCED,
        description=("'tracin': TracIn computed exactly from the checkpoints; 'tracin_projected' (TracIn with "
                     "projected gradients, approximate) and 'trak' (projected gradients with a Gauss-Newton "
                     "inverse; its defaults are the configuration the attribution-quality evaluations measured) "
                     "score against the features stored by a featurize job with the same checkpoints, layers, "
                     "loss, projection size and seed (mode 'test', no filter, a number of triples listed)"))
    seed: int = Field(trak_config.TRAK_SEED, ge=0, le=limits.MAX_SEED, title="Projection seed", json_schema_extra=ADVANCED,
                      description="For the stored-feature estimators: the seed of the random projection")
    damping: float = Field(trak_config.TRAK_DAMPING, gt=0, le=1e6, title="TRAK damping", json_schema_extra=ADVANCED,
                           description=("For 'trak': damping relative to the mean eigenvalue of the projected "
                                        "Gauss-Newton matrix (default: the evaluated TRAK's)"))
    shard_size: ShardSize = shard_size_field("modes 'test' and 'self': candidate training triples")
    max_failed_fraction: float = max_failed_field("candidate training triples")
    shard_retries: int = shard_retries_field()

    _estimator_name = field_validator("estimator", mode="before")(estimators.canonical)

    @model_validator(mode="after")
    def _default_loss(self) -> TracInRequest:
        """No loss given: ``DEFAULT_LOSS``, or featurize's default loss for the stored-feature estimators (the
        features a default featurize job stored)."""
        if self.loss is None:
            self.loss = STORED_DEFAULT_LOSS if estimators.get(self.estimator).stored else DEFAULT_LOSS
        return self


_VOCABS: OrderedDict[str, dict[str, Any]] = OrderedDict()  # model version -> vocabulary (versions are immutable)


def model_vocab(settings: Settings, model: str) -> dict[str, Any]:
    """Entities, relations and checkpoint names of a registered ConvE model, read from its config.json and id
    dictionaries in the bounded parser (:func:`core.parsers.model_vocab`); FieldError on ``model``."""
    entry = require_model(settings, model, "conve")
    version = f"{entry.get('location') or entry.get('path')}|{entry.get('created_at')}"
    vocab = _VOCABS.get(version)
    if vocab is None:
        answer = run_bounded(settings, "model.vocab", {"entry": entry}, loc=("body", "model"), value=model,
                             shown=f"the files of model {model!r}")
        raise_if_store_down(answer)
        if answer.get("missing"):
            raise FieldError(("body", "model"), f"model {model!r} has no files in the store", value=model)
        if "error" in answer:
            raise FieldError(("body", "model"), answer["error"], value=model)
        vocab = {field: frozenset(answer[field]) for field in ("entities", "relations", "checkpoints")}
        _VOCABS[version] = vocab
        while len(_VOCABS) > 32:
            _VOCABS.popitem(last=False)
    return vocab


def _check_triples(field: str, triples: list[list[str]], vocab: dict[str, Any]) -> None:
    for i, trip in enumerate(triples):
        for j, (name, kind) in enumerate(zip(trip, ("entity", "relation", "entity"), strict=True)):
            known = vocab["relations"] if kind == "relation" else vocab["entities"]
            if name not in known:
                raise FieldError(("body", field, i, j), f"unknown {kind} {name!r}", value=name)


def _read_test_triples_path(req: TracInRequest, settings: Settings) -> None:
    """Replace ``test_triples_path`` by the triples it holds (so the job is reproducible from its payload)."""
    loc = ("body", "test_triples_path")
    if req.test_triples is not None:
        raise FieldError(loc, "give test_triples or test_triples_path, not both", value=req.test_triples_path)
    try:
        path = resolve_data_path(settings, req.test_triples_path)
    except PathError as exc:
        raise FieldError(loc, str(exc), value=req.test_triples_path) from None
    answer = run_bounded(settings, "triples.read", {"path": str(path), "value": req.test_triples_path,
                                                    "max_rows": MAX_TEST_TRIPLES},
                         loc=loc, value=req.test_triples_path, shown=display(settings, path))
    if "error" in answer:
        raise FieldError(loc, answer["error"], value=req.test_triples_path)
    rows = answer["rows"]
    if not rows:
        raise FieldError(loc, "the file holds no triples", value=req.test_triples_path)
    req.test_triples = [list(r) for r in rows]


def _check_mode_inputs(req: TracInRequest) -> None:
    """The triples each mode needs (and only those), and test triples for a filter to centre on."""
    if req.mode != "self" and not req.test_triples:
        raise FieldError(("body", "test_triples"), f"mode {req.mode!r} needs test_triples", value=req.test_triples)
    if req.mode == "single" and not req.train_triples:
        raise FieldError(("body", "train_triples"), "mode 'single' needs train_triples", value=req.train_triples)
    if req.mode != "single" and req.train_triples is not None:
        raise FieldError(("body", "train_triples"), "train_triples is only used by mode 'single'",
                         value=req.train_triples)
    if req.filter is not None and not req.test_triples:
        raise FieldError(("body", "filter"), "the filter is centred on test_triples; give some", value=None)


def _check_triple_names(req: TracInRequest, vocab: dict[str, Any]) -> None:
    """Every entity and relation of the test and training triples is one the model knows."""
    if req.test_triples:
        field = "test_triples_path" if req.test_triples_path is not None else "test_triples"
        _check_triples(field, req.test_triples, vocab)
    if req.train_triples:
        _check_triples("train_triples", req.train_triples, vocab)


def _check_checkpoints(req: TracInRequest, vocab: dict[str, Any]) -> None:
    if req.checkpoints != "all":
        for i, name in enumerate(req.checkpoints):
            if name not in vocab["checkpoints"]:
                raise FieldError(("body", "checkpoints", i), f"unknown checkpoint {name!r}; the model has "
                                 f"{sorted(vocab['checkpoints'])}", value=name)


def _check_layers(req: TracInRequest) -> None:
    """Named layers exist, and the output embedding is not asked for twice."""
    if req.layers not in ("all", "last"):
        for i, name in enumerate(req.layers):
            if name not in LAYER_NAMES:
                raise FieldError(("body", "layers", i), f"unknown layer {name!r}; choose from {list(LAYER_NAMES)}",
                                 value=name)
        if "ent.weight:output" in req.layers and ("ent.weight" in req.layers or "ent" in req.layers):
            raise FieldError(("body", "layers"), "'ent.weight' already includes 'ent.weight:output'",
                             value=req.layers)


def _check_sizes(req: TracInRequest) -> None:
    """A usable shard size, no more listed entries than one result holds, and no more (test, train) pairs in mode
    'single' than one job returns."""
    if req.shard_size != "auto" and req.shard_size < 1:
        raise FieldError(("body", "shard_size"), "shard_size must be >= 1 or 'auto'", value=req.shard_size)
    n_test = len(req.test_triples or ())
    if req.mode == "test" and req.top_k is not None and n_test * req.top_k > limits.MAX_TRACIN_LISTED:
        raise FieldError(("body", "top_k"), f"{n_test} test triples x top_k {req.top_k} is more than "
                         f"{limits.MAX_TRACIN_LISTED:,} listed proponents (and as many opponents) per result; "
                         "lower top_k, split the test triples over jobs, or use top_k null (every score, to "
                         "scores.npy)", value=req.top_k)
    if req.mode == "single" and req.train_triples and req.test_triples \
            and len(req.train_triples) * len(req.test_triples) > MAX_SINGLE_PAIRS:
        raise FieldError(("body", "train_triples"), f"mode 'single' scores every (test, train) pair and returns "
                         f"them all: {len(req.test_triples)} x {len(req.train_triples)} pairs is more than "
                         f"{MAX_SINGLE_PAIRS}; use mode 'test' with top_k for larger sets", value=len(req.train_triples))


def _check_method(req: TracInRequest) -> None:
    """Method 'vmap' is the fp32 reference: no projection, no reduced precision."""
    if req.method == "vmap" and req.projection_dim is not None:
        raise FieldError(("body", "projection_dim"), "projection_dim needs method 'ghost'", value=req.projection_dim)
    if req.method == "vmap" and req.precision not in ("auto", "fp32"):
        raise FieldError(("body", "precision"), "method 'vmap' is the fp32 reference", value=req.precision)


def _check_estimator(req: TracInRequest) -> None:
    """Estimators over stored features answer mode 'test' over every training triple, top-k, from the stored
    projection: the options they cannot honour are errors, not silently ignored (a field sent with its default
    value, as the dashboard's form sends every field, changes nothing and passes)."""

    def changed(name: str) -> bool:
        return name in req.model_fields_set and getattr(req, name) != type(req).model_fields[name].default

    if not estimators.get(req.estimator).stored:
        for name in ("seed", "damping"):
            if changed(name):
                raise FieldError(("body", name), f"{name} is used by the estimators over stored features only",
                                 value=getattr(req, name))
        return
    if req.estimator != "trak" and changed("damping"):
        raise FieldError(("body", "damping"), "damping is used by estimator 'trak' only", value=req.damping)
    if req.estimator == "trak" and changed("lr_weight"):
        raise FieldError(("body", "lr_weight"), "estimator 'trak' weighs every checkpoint equally; lr_weight is "
                         "for the TracIn estimators", value=req.lr_weight)
    checks = (("mode", req.mode != "test", "answers mode 'test' only"),
              ("filter", req.filter is not None, "scores every training triple: no filter"),
              ("top_k", req.top_k is None, "lists the top_k strongest: top_k must be set"),
              ("method", req.method != "ghost", "uses stored projected gradients, not method 'vmap'"),
              ("precision", req.precision not in ("auto", "fp32"), "runs in fp32"))
    for name, bad, why in checks:
        if bad:
            value = getattr(req, name)
            raise FieldError(("body", name), f"estimator {req.estimator!r} {why}",
                             value=value.model_dump() if hasattr(value, "model_dump") else value)


def validate(req: TracInRequest, settings: Settings, owner: str = "system") -> None:
    vocab = model_vocab(settings, req.model)
    if req.test_triples_path is not None:
        _read_test_triples_path(req, settings)
    _check_mode_inputs(req)
    _check_triple_names(req, vocab)
    _check_checkpoints(req, vocab)
    _check_layers(req)
    _check_sizes(req)
    _check_method(req)
    _check_estimator(req)
    _check_shard_count(req, settings)


def _check_shard_count(req: TracInRequest, settings: Settings) -> None:
    """A fixed shard_size makes at most ``EXPLAINQ_MAX_SHARDS`` shards of the candidates, where their number is
    known here: every training triple of the model (modes test and self, no filter); the worker checks the rest."""
    if req.shard_size == "auto" or req.mode not in ("test", "self") or req.filter is not None \
            or estimators.get(req.estimator).stored:
        return
    n = (require_model(settings, req.model, "conve").get("meta") or {}).get("train_triples")
    if isinstance(n, int):
        problem = too_many_shards(n, req.shard_size, settings.max_shards, "candidate training triples")
        if problem is not None:
            raise FieldError(("body", "shard_size"), problem, value=req.shard_size)


register(JobKind(
    name="tracin",
    route="/tracin",
    request=TracInRequest,
    queue="explain",
    func="workers.jobs.tracin:run",
    # modes test and self split their candidate training triples; the test triples are read from the parent
    fanout=FanOut(unit="candidates", shard="workers.jobs.tracin:run_shard", reduce="workers.jobs.tracin:run_reduce",
                  timeout_s=4 * 3600, from_parent=("test_triples",)),
    timeout_s=3600,
    result_ttl_s=7 * 24 * 3600,
    summary="TracIn influence of training triples on a ConvE prediction",
    title="TracIn influence",
    renderer="influence",
    pickers={"model": ("models", "conve")},
    widgets={"test_triples": "triples", "train_triples": "triples"},
    validate=validate,
))
