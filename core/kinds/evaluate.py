"""``POST /evaluate/attribution`` and ``POST /evaluate/mislabel``: how good a data-attribution estimator is on a
ConvE recipe and a triples dataset (no torch here; the maths is ``models/kg/evaluation.py``).

- ``evaluate_attribution``: the linear datamodeling score (LDS) of each estimator, from ``m`` models trained on
  random ``alpha``-subsets of the training triples (one shard per subset model, fanned out over the ``bulk``
  workers) and the full-data model the estimators run on. The subset models' masks and outputs are kept in the
  store under a content address (recipe, data version, alpha, m, seed), so a later evaluation of other estimators
  trains nothing. An ensemble estimator (``trak_ensemble``) also needs ``ensemble`` more full-data models of the
  recipe with other seeds, trained as further shards and stored the same way. An evaluation whose models are all
  stored runs as one job; either way its result is one :class:`LdsResult`
  (``core/contract/results/evaluation.py``).
- ``evaluate_mislabel``: corrupt a seeded ``fraction`` of the training triples' tails, train, and rank the training
  triples by each estimator's self-influence: AUC, found@10%/20%, the recall curve (:class:`MislabelResult`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from core import estimates, estimators, limits, memory
from core.contract.errors import FieldError
from core.contract.fields import ADVANCED, JobRequest, RequestModel, shard_retries_field
from core.contract.kind import FanOut, JobKind, register
from core.contract.results.evaluation import LdsResult, MislabelResult
from core.kinds.train_conve import NATIONS, dataset_counts, resolve_dataset, split_counts
from core.settings import Settings
from models.kg.shapes import check_image

MAX_SCORE_CELLS = 4_000_000  # scores-<estimator>.npy is written when n_test x n_train is at most this
DEFAULT_ESTIMATORS = list(estimators.names(evaluated=True, default=True))
DEFAULT_MISLABEL_ESTIMATORS = list(estimators.names(evaluated=True, ensemble=False, default=True))
# the estimators an evaluation measures (core.estimators: one registry, one meaning per name), listed in the
# OpenAPI schema
EstimatorName = estimators.choices(evaluated=True)


def _estimators_field(default: list[str], note: str) -> Any:
    """The ``estimators`` field of both request kinds (their defaults and descriptions differ)."""
    return Field(list(default), min_length=1, max_length=limits.MAX_EVAL_ESTIMATORS, title="Estimators compared",
                 description="The data-attribution estimators measured, each at most once" + note)


def ensemble_members(names: list[str], ensemble: int) -> int:
    """The ensemble members an LDS evaluation trains: ``ensemble`` when it asks for an ensemble estimator, else 0
    (the API's budget check and the worker's plan both count them here)."""
    return int(ensemble) if any(estimators.get(e).ensemble for e in names) else 0


class Recipe(RequestModel):
    """How every model of the evaluation is trained (``models.kg.train.TrainConfig``); ``seed`` is the full-data
    model's recipe seed (mixed with the evaluation's seed), each subset model trains with a seed of its own. The defaults are the Nations demo model's."""

    epochs: int = Field(10, ge=1, le=limits.MAX_EVAL_EPOCHS, title="Training epochs",
                        description="Passes over the training triples, for every model the evaluation trains")
    batch_size: int = Field(128, ge=2, le=limits.MAX_TRAIN_BATCH_SIZE, title="Triples per batch",
                            json_schema_extra=ADVANCED, description="Training triples per optimizer step")
    lr: float = Field(0.01, gt=0, le=10, title="Learning rate", description="Adam's learning rate")
    lr_decay: float = Field(1.0, gt=0, le=1, title="Learning-rate decay", json_schema_extra=ADVANCED,
                            description="Multiplier of the learning rate after each epoch (1: constant)")
    weight_decay: float = Field(0.0, ge=0, le=1, title="L2 weight decay", json_schema_extra=ADVANCED,
                                description="Adam's L2 penalty on the weights")
    label_smoothing: float = Field(0.1, ge=0, lt=1, title="Label-smoothing share", json_schema_extra=ADVANCED,
                                   description="Share of the target mass spread over every entity")
    embedding_dim: int = Field(100, ge=6, le=limits.MAX_EMBEDDING_DIM, title="Embedding size",
                               description="Size of the entity and relation embeddings")
    embedding_height: int | None = Field(None, ge=1, le=limits.MAX_EMBEDDING_DIM, title="Embedding image height",
                                         json_schema_extra=ADVANCED,
                                         description="Height of the 2-D image an embedding is reshaped to")
    num_filters: int = Field(32, ge=1, le=limits.MAX_CONVE_FILTERS, title="Convolution filters",
                             json_schema_extra=ADVANCED, description="Filters of ConvE's convolution")
    input_dropout: float = Field(0.2, ge=0, lt=1, title="Input dropout rate", json_schema_extra=ADVANCED,
                                 description="Share of the embedding image dropped while training")
    feature_dropout: float = Field(0.2, ge=0, lt=1, title="Feature-map dropout rate", json_schema_extra=ADVANCED,
                                   description="Share of the convolution's feature maps dropped while training")
    hidden_dropout: float = Field(0.3, ge=0, lt=1, title="Hidden-layer dropout rate", json_schema_extra=ADVANCED,
                                  description="Share of the hidden layer dropped while training")
    reciprocal: bool = Field(True, title="Add reciprocal relations", json_schema_extra=ADVANCED,
                             description="Also train on each triple reversed, with an inverse relation")
    checkpoint_every: int = Field(2, ge=1, le=limits.MAX_EVAL_EPOCHS, title="Checkpoint interval",
                                  json_schema_extra=ADVANCED,
                                  description="The full-data model keeps a checkpoint every this many epochs "
                                  "and at the last one: the checkpoints the estimators use")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Full-data model's seed", json_schema_extra=ADVANCED,
                      description="The training seed of a mislabel evaluation's model; an LDS evaluation mixes it "
                                  "with its own seed into the full-data model's (each subset model trains with a "
                                  "seed of its own)")


class _EvaluateRequest(JobRequest):
    dataset: str = Field(NATIONS, min_length=1, max_length=limits.MAX_PATH_LENGTH, title="Triples dataset",
                         description="'nations', 'umls' or 'kinships' (shipped), a registered triples dataset, or a "
                         "directory under the data roots")
    recipe: Recipe = Field(default_factory=Recipe, title="Training recipe",
                           description="How every model of the evaluation is trained (ConvE)")
    estimators: list[EstimatorName] = _estimators_field(DEFAULT_ESTIMATORS, "")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Random seed", json_schema_extra=ADVANCED,
                      description="Seed of the corruption, or of an LDS evaluation's every draw (subsets, their "
                      "training, the test triples, the full-data model: another seed is an independent replicate) "
                      "and of the bootstrap")


class EvaluateAttributionRequest(_EvaluateRequest):
    m: int = Field(64, ge=3, le=limits.MAX_EVAL_MODELS, title="Subset models",
                   description="How many models are trained on random subsets (the ground truth the scores predict)")
    alpha: float = Field(0.5, gt=0, lt=1, title="Subset share",
                         description="Share of the training triples in each subset")
    n_test: int = Field(100, ge=1, le=limits.MAX_EVAL_TEST_TRIPLES, title="Test triples evaluated",
                        description="A seeded draw from the dataset's test split (all of it when it holds fewer)")
    ensemble: int = Field(4, ge=1, le=limits.MAX_EVAL_ENSEMBLE, title="Ensemble members",
                          json_schema_extra=ADVANCED,
                          description="Further full-data models (the recipe with other seeds) that trak_ensemble "
                          "averages over; trained only when an ensemble estimator is asked for")
    replicates: bool = Field(False, title="Measure the noise ceiling", json_schema_extra=ADVANCED,
                             description="Also train every subset model again on the same subset with another seed "
                             "(m more trainings) and report how well the two agree: the most any estimator's LDS "
                             "can reach on this ground truth")
    output: Literal["margin", "loss"] = Field(
        "margin", title="Test-side output", json_schema_extra=ADVANCED,
        description="The function whose gradient TracIn's test side takes: 'margin' (the true tail's margin on the "
        "tail query, the quantity the LDS measures, as TRAK uses) or 'loss' (the training loss, as POST /tracin); "
        "each estimator's result states the output it used")
    shard_retries: int = shard_retries_field()

    def members(self) -> int:
        """The ensemble members this evaluation needs (0 when no ensemble estimator is asked for)."""
        return ensemble_members(self.estimators, self.ensemble)


class EvaluateMislabelRequest(_EvaluateRequest):
    estimators: list[EstimatorName] = _estimators_field(
        DEFAULT_MISLABEL_ESTIMATORS, " (not the ensemble ones: one model of the corrupted graph is trained)")
    fraction: float = Field(0.1, gt=0, le=0.5, title="Corrupted share",
                            description="Share of the training triples whose tail is replaced by a random other entity")


def _check_common(req: _EvaluateRequest, settings: Settings, owner: str) -> Path | None:
    """The checks both kinds share; returns the dataset's directory (None: the shipped nations)."""
    path = resolve_dataset(settings, req.dataset, owner)
    seen: set[str] = set()
    for i, name in enumerate(req.estimators):
        if name in seen:
            raise FieldError(("body", "estimators", i), f"estimator {name!r} is named twice", value=name)
        seen.add(name)
    problem = check_image(req.recipe.embedding_dim, req.recipe.embedding_height)
    if problem:
        field = "embedding_height" if req.recipe.embedding_height is not None else "embedding_dim"
        raise FieldError(("body", "recipe", field), problem, value=getattr(req.recipe, field))
    _check_memory(req, settings, owner)
    return path


def _check_memory(req: _EvaluateRequest, settings: Settings, owner: str) -> None:
    """Each model the evaluation trains fits ``EXPLAINQ_WORKER_MEMORY_BYTES`` (as ``POST /train/conve`` checks)."""
    r = req.recipe
    counts = dataset_counts(settings, req.dataset, owner)
    est = memory.conve_training(counts["entities"], counts["relations"], r.embedding_dim, r.embedding_height,
                                r.num_filters, r.batch_size, r.reciprocal)
    sizes = [("recipe.embedding_dim", r.embedding_dim), ("recipe.num_filters", r.num_filters)]
    fields = sizes + [("recipe.batch_size", r.batch_size)]
    if est.activation_bytes > est.parameter_bytes:
        fields = [("recipe.batch_size", r.batch_size), *sizes]
    memory.check_budget(settings, est, fields, f"ConvE with embedding_dim {r.embedding_dim}, num_filters "
                        f"{r.num_filters} and batch_size {r.batch_size} on {req.dataset!r}")


def validate_attribution(req: EvaluateAttributionRequest, settings: Settings, owner: str = "system") -> None:
    path = _check_common(req, settings, owner)
    if path is not None and not (path / "test.txt").is_file():
        raise FieldError(("body", "dataset"), f"dataset {req.dataset!r} has no test.txt: the LDS is measured on "
                         "test triples", value=req.dataset)
    members = req.members()
    total = (req.m * (2 if req.replicates else 1) + members) * req.recipe.epochs
    if total > limits.MAX_EVAL_TRAINING_EPOCHS:
        subsets = f"2 x m {req.m}" if req.replicates else f"m {req.m}"
        models = f"({subsets} + ensemble {members})" if members else subsets
        related = [(("body", "recipe", "epochs"), req.recipe.epochs)]
        if members:
            related.append((("body", "ensemble"), req.ensemble))
        if req.replicates:
            related.append((("body", "replicates"), req.replicates))
        raise FieldError(("body", "m"), f"{models} x recipe.epochs {req.recipe.epochs} = {total} training epochs, "
                         f"more than {limits.MAX_EVAL_TRAINING_EPOCHS:,} per evaluation", value=req.m,
                         related=related)


def validate_mislabel(req: EvaluateMislabelRequest, settings: Settings, owner: str = "system") -> None:
    for i, name in enumerate(req.estimators):
        if estimators.get(name).ensemble:
            raise FieldError(("body", "estimators", i), f"estimator {name!r} averages over independently trained "
                             "models and is measured by LDS only (mislabel detection trains one model of the "
                             "corrupted graph); use 'trak'", value=name)
    _check_common(req, settings, owner)


# ------------------------------------------------------------------------------------------------ estimates
REUSE = ("at most: a model an earlier evaluation of the same recipe and data stored (whoever ran it) is reused, "
         "not trained")


def _checkpoints(recipe: Recipe) -> int:
    """The checkpoints a kept model directory holds: every ``checkpoint_every`` epochs and the last."""
    return len(set(range(recipe.checkpoint_every, recipe.epochs + 1, recipe.checkpoint_every)) | {recipe.epochs})


def _sizes(req: _EvaluateRequest, settings: Settings, owner: str) -> tuple[dict[str, Any], int, Any] | None:
    """The dataset's counts, the recipe's parameter count and a sizer of a model trained on ``n`` triples; None
    when the dataset's triples are not counted (registered without counts)."""
    counts = split_counts(settings, req.dataset, owner)
    if counts["train_triples"] is None:
        return None
    r = req.recipe
    params = memory.conve_training(int(counts["entities"] or 0), int(counts["relations"] or 0), r.embedding_dim,
                                   r.embedding_height, r.num_filters, r.batch_size, r.reciprocal).parameters

    def size(n: int) -> estimates.TrainingSize:
        return estimates.TrainingSize("triples", n * (2 if r.reciprocal else 1), r.epochs, r.batch_size, params)
    return counts, params, size


def _model_dir_bytes(req: _EvaluateRequest, params: int) -> int:
    """A kept model directory's weights: its final weights and each checkpoint (the copy of the triples it holds
    is left out)."""
    return (1 + _checkpoints(req.recipe)) * params * estimates.FLOAT_BYTES


def attribution_size(req: EvaluateAttributionRequest, settings: Settings,
                     owner: str = "system") -> estimates.EvaluationSize | None:
    """What an LDS evaluation trains and writes, before it is submitted (``POST /kinds/evaluate_attribution/
    estimate``): ``m`` subset models on ``ceil(alpha x n_train)`` triples (``m`` more with ``replicates``), the
    full-data model, the ensemble members."""
    validate_attribution(req, settings, owner)
    sized = _sizes(req, settings, owner)
    if sized is None:
        return None
    counts, params, size = sized
    n = int(counts["train_triples"])
    n_test_split = int(counts["test_triples"] or 0)
    n_test = min(req.n_test, n_test_split)
    subset = min(n, max(1, math.ceil(req.alpha * n)))
    groups = [estimates.ModelGroup("subset model", req.m, size(subset))]
    if req.replicates:
        groups.append(estimates.ModelGroup("subset replicate", req.m, size(subset)))
    groups.append(estimates.ModelGroup("full-data model", 1, size(n)))
    if req.members():
        groups.append(estimates.ModelGroup("ensemble member", req.members(), size(n)))
    subsets = req.m * (2 if req.replicates else 1)
    scores = len(req.estimators) * n_test * n * 8 if n_test * n <= MAX_SCORE_CELLS else 0
    disk = {"models": (1 + req.members()) * _model_dir_bytes(req, params),
            "ground_truth": subsets * (n + n_test_split * 8),
            "artifacts": req.m * n + subsets * n_test * 8 + scores}
    return estimates.EvaluationSize(tuple(groups), params, disk, REUSE)


def mislabel_size(req: EvaluateMislabelRequest, settings: Settings,
                  owner: str = "system") -> estimates.EvaluationSize | None:
    """What a mislabel evaluation trains and writes: one model of the corrupted graph; each estimator's
    self-scores and its ranking (``suspects.csv``)."""
    validate_mislabel(req, settings, owner)
    sized = _sizes(req, settings, owner)
    if sized is None:
        return None
    counts, params, size = sized
    n, e = int(counts["train_triples"]), len(req.estimators)
    disk = {"models": _model_dir_bytes(req, params), "artifacts": e * n * (8 + estimates.SUSPECT_ROW_BYTES)}
    return estimates.EvaluationSize((estimates.ModelGroup("corrupted-graph model", 1, size(n)),), params,
                                    disk, REUSE)


PICKERS = {"dataset": ("datasets", "triples")}

register(JobKind(
    name="evaluate_attribution",
    route="/evaluate/attribution",
    request=EvaluateAttributionRequest,
    queue="bulk",
    func="workers.jobs.evaluate:run_attribution",
    # one shard per model the ground truth lacks (subset models, replicates, the full-data model, members)
    fanout=FanOut(unit="models", shard="workers.jobs.evaluate:run_shard", reduce="workers.jobs.evaluate:run_reduce",
                  timeout_s=12 * 3600),
    timeout_s=12 * 3600,
    result_ttl_s=30 * 24 * 3600,
    summary="Linear datamodeling score (LDS) of data-attribution estimators, from models retrained on random "
            "subsets of the training triples",
    title="Attribution quality (LDS)",
    renderer="evaluation",
    result=LdsResult,
    sdk_method="evaluate_attribution",
    pickers=PICKERS,
    validate=validate_attribution,
    recheck=True,
    estimate=attribution_size,
    estimate_rate_from="train_conve",
))

register(JobKind(
    name="evaluate_mislabel",
    route="/evaluate/mislabel",
    request=EvaluateMislabelRequest,
    queue="bulk",
    func="workers.jobs.evaluate:run_mislabel",
    timeout_s=12 * 3600,
    result_ttl_s=30 * 24 * 3600,
    summary="Mislabel detection: corrupt a fraction of the training triples' tails, train, rank by each "
            "estimator's self-influence",
    title="Mislabel detection",
    renderer="evaluation",
    result=MislabelResult,
    sdk_method="evaluate_mislabel",
    pickers=PICKERS,
    validate=validate_mislabel,
    recheck=True,
    estimate=mislabel_size,
    estimate_rate_from="train_conve",
))
