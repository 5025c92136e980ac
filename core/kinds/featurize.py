"""``POST /featurize``: store each training triple's projected gradient features of a ConvE model (no torch here).

The features (:mod:`models.explain.features`) are kept in the file store under ``features/``, content-addressed by
the checkpoint weights and the settings, so a repeated request computes nothing and appended training triples or a
new checkpoint compute only what is new. Later TRAK and projected-TracIn queries of the model score against them.

The defaults are the features the attribution-quality evaluations' ``trak`` reads (:mod:`models.kg.trak_config`,
torch-free, the one definition the evaluation runs): every checkpoint and layer, gradients of the margin, the
evaluated k for the model's training triples, projection seed 0. So a default featurize job serves a default
``POST /tracin`` query with ``estimator: "trak"``, which then runs the evaluated configuration.

Only the model's owner may featurize it (the features are stored for as long as the model is used): another owner's
model is a 409 on ``model``, as for every name an owner holds.
"""

from __future__ import annotations

from pydantic import Field

from core import estimators, limits, registry
from core.contract.errors import FieldConflict
from core.contract.fields import ADVANCED, RequestModel
from core.contract.kind import JobKind, register
from core.contract.results.base import Artifact, ResultModel
from core.contract.results.influence import RunConfiguration
from core.contract.results.provenance import PROVENANCE_DESCRIPTION, Provenance
from core.kinds.tracin import Checkpoints, Layers, Loss, _check_checkpoints, _check_layers, model_vocab
from core.ownership import owns
from core.settings import Settings
from models.kg import trak_config

MAX_PROJ_DIM = 8192  # models.explain.trak.MAX_PROJ_DIM: one k x k Gauss-Newton matrix per checkpoint


class FeaturizeRequest(RequestModel):
    model: str = Field(..., min_length=1, max_length=limits.MAX_NAME_LENGTH, title="Knowledge-graph model",
                       description="A ConvE model of yours (or a shared demo model) whose training triples to featurize")
    checkpoints: Checkpoints = Field(
        "all", title="Checkpoints featurized", json_schema_extra=ADVANCED,
        description="'all', or the checkpoints to store features for (file names or epochs)")
    layers: Layers = Field(
        "all", title="Layers compared", json_schema_extra=ADVANCED,
        description="'all', 'last', or the layers whose gradients are projected")
    loss: Loss = Field(
        trak_config.TRAK_LOSS, title="Gradient of", json_schema_extra=ADVANCED,
        description=("Whose gradients are stored: the negated margin of the tail query ('margin', the default: "
                     "TRAK's output function, the quantity the attribution-quality evaluations measure), the "
                     "training loss ('train') or the binary cross-entropy of the score ('score_bce')"))
    proj_dim: int | None = Field(
        None, ge=1, le=MAX_PROJ_DIM, title="Projection size",
        description=(f"Dimensions each gradient is projected to: more is closer to exact, and larger; empty: the "
                     f"evaluated TRAK's, {trak_config.TRAK_PROJ_DIM:,} (halved, down to "
                     f"{trak_config.TRAK_MIN_PROJ_DIM}, while the training triples' float32 features would pass "
                     f"{trak_config.TRAK_MAX_FEATURE_BYTES >> 30} GiB)"))
    seed: int = Field(trak_config.TRAK_SEED, ge=0, le=limits.MAX_SEED, title="Projection seed",
                      json_schema_extra=ADVANCED,
                      description="Seed of the random projection; queries must name the same one")
    batch_size: int = Field(256, ge=1, le=limits.MAX_TRACIN_BATCH_SIZE, title="Training triples per pass",
                            json_schema_extra=ADVANCED, description="Training triples featurized together")


class FeaturizedCheckpoint(ResultModel):
    """One checkpoint's features: its feature key in the store and how many rows were reused or computed."""

    checkpoint: str
    key: str
    rows: int
    reused: int
    computed: int


class FeaturizeResult(ResultModel):
    """What a featurize job stored, and the estimators that now answer ``POST /tracin`` from it (with the same
    checkpoints, layers, loss, ``projection_dim`` = ``proj_dim`` and seed)."""

    model: str
    format: str
    layers: list[str]
    loss: str
    proj_dim: int = Field(description="the projection size the features were stored with (the evaluated TRAK's "
                          "when the request left it empty)")
    seed: int
    projection: str | None = Field(None, description="the random projection: 'kronecker' (models.explain.trak)")
    configuration: RunConfiguration | None = Field(
        None, description="the features' configuration (ran: checkpoints, layers, loss, projection_dim, seed, "
        "projection), the one the evaluated 'trak' reads (evaluated: the same fields) and whether they match: "
        "when they do, a POST /tracin 'trak' query with its default damping runs the evaluated configuration")
    n_train: int
    checkpoints: list[FeaturizedCheckpoint]
    rows_computed: int
    serves: list[str] = Field(default_factory=lambda: list(estimators.names(stored=True)),
                              description="the estimators a query can score against these features")
    seconds: float
    artifacts: list[Artifact] = Field(default_factory=list)
    provenance: Provenance | None = Field(None, description=PROVENANCE_DESCRIPTION)


def validate(req: FeaturizeRequest, settings: Settings, owner: str = "system") -> None:
    vocab = model_vocab(settings, req.model)  # a ConvE model with files (422 on model otherwise)
    entry = registry.get_model(settings, req.model) or {}
    # the caller's own models and the shared (system) demos, which every key may already explain; another
    # tenant's model is theirs to featurize
    if not (owns(entry, owner) or owns(entry, registry.SYSTEM)):
        raise FieldConflict(("body", "model"), f"model {req.model!r} belongs to another owner; only its owner may "
                            "featurize it", value=req.model)
    _check_checkpoints(req, vocab)
    _check_layers(req)


register(JobKind(
    name="featurize",
    route="/featurize",
    request=FeaturizeRequest,
    queue="bulk",
    func="workers.jobs.featurize:run",
    timeout_s=4 * 3600,
    result_ttl_s=7 * 24 * 3600,
    summary="Store the projected gradient features of a ConvE model's training triples",
    title="Gradient features",
    pickers={"model": ("models", "conve")},
    result=FeaturizeResult,
    validate=validate,
    recheck=True,
))
