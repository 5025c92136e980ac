"""``POST /evaluate/classifier/attribution`` and ``POST /evaluate/classifier/mislabel``: how good the classifier
data-attribution estimators are on a classifier, a recipe and a dataset: an exported classifier on a tensors
dataset or a Hugging Face classifier on a text dataset (no torch here; the maths is ``models/export/evaluation.py``
and ``models/hf/evaluation.py`` over ``models/kg/evaluation.py``'s statistics).

- ``evaluate_classifier_attribution``: the LDS of each estimator, from ``m`` models trained on random
  ``alpha``-subsets of the training examples (one shard per subset model, fanned out over the ``bulk`` workers),
  each trained by ``recipe`` from the imported model's own weights, and the full-data model of the recipe the
  estimators run on; with ``replicates``, each subset model is trained again with another seed (the noise
  ceiling); ``trak_ensemble`` also gets ``ensemble`` more full-data models with other seeds. Every model is stored
  under a content address (the model's files, the recipe, the data, alpha, m, seed) and reused by later evaluations.
- ``evaluate_classifier_mislabel``: flip a seeded ``fraction`` of the training labels to another class, train the
  recipe on them, rank the training examples by each estimator's self-influence: ROC AUC with its interval.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field

from core import estimates, estimators, limits
from core.contract.checks import require_model
from core.contract.errors import FieldError
from core.contract.fields import ADVANCED, JobRequest, RequestModel, shard_retries_field
from core.contract.kind import FanOut, JobKind, register
from core.contract.results.classifier_evaluation import ClassifierLdsResult, ClassifierMislabelResult
from core.kinds.attributions import class_names, model_spec
from core.kinds.classifier_influence import kfac_problem
from core.kinds.evaluate import MAX_SCORE_CELLS
from core.kinds.train_classifier import (
    BYTES_PER_PARAMETER,
    BYTES_PER_VALUE,
    DATASET_KIND,
    HF_KIND,
    MAX_EXAMPLE_STEPS,
    MODEL_KIND,
    TEXT_DATASET_KIND,
    dataset_counts,
    fine_tune_bytes,
)
from core.memory import gib
from core.placement import memory_budget
from core.settings import Settings
from models.textdata import label_indices

EstimatorName = estimators.choices(classifier_evaluated=True)
DEFAULT_ESTIMATORS = ["tracin", "trak", "graddot", "random"]
DEFAULT_MISLABEL_ESTIMATORS = ["tracin", "trak", "random"]


class ClassifierRecipe(RequestModel):
    """How every model of the evaluation is trained (``models.training.TrainOptions``, as ``POST
    /train/classifier`` trains): from the imported model's weights, each model with a seed of its own."""

    epochs: int = Field(5, ge=1, le=limits.MAX_EVAL_EPOCHS, title="Training epochs",
                        description="Passes over the training examples, for every model the evaluation trains")
    batch_size: int = Field(32, ge=1, le=limits.MAX_TRAIN_BATCH_SIZE, title="Examples per batch",
                            json_schema_extra=ADVANCED, description="Training examples per optimizer step")
    optimizer: Literal["sgd", "adam", "adamw"] = Field("sgd", title="Update rule",
                                                       description="SGD with momentum, Adam, or AdamW")
    lr: float = Field(0.05, gt=0, le=10, title="Learning rate", description="The optimizer's learning rate")
    momentum: float = Field(0.9, ge=0, lt=1, title="SGD momentum", json_schema_extra=ADVANCED,
                            description="SGD's momentum (not used by Adam)")
    weight_decay: float = Field(0.0, ge=0, le=1, title="L2 weight decay", json_schema_extra=ADVANCED,
                                description="The optimizer's weight decay")
    checkpoint_every: int = Field(1, ge=1, le=limits.MAX_EVAL_EPOCHS, title="Checkpoint interval",
                                  json_schema_extra=ADVANCED,
                                  description="The full-data model keeps a checkpoint every this many epochs and "
                                  "at the last one: the checkpoints the estimators sum over")
    max_length: int = Field(128, ge=2, le=4096, title="Tokens per text", json_schema_extra=ADVANCED,
                            description="Hugging Face classifiers: each text is cut to this many tokens, in training "
                            "and in the estimators")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Full-data model's seed", json_schema_extra=ADVANCED,
                      description="Mixed with the evaluation's seed into the full-data model's training seed (a "
                      "mislabel evaluation's model likewise)")


def _estimators_field(default: list[str], note: str) -> Any:
    return Field(list(default), min_length=1, max_length=limits.MAX_EVAL_ESTIMATORS, title="Estimators compared",
                 description="The classifier data-attribution estimators measured, each at most once" + note)


class _ClassifierEvaluateRequest(JobRequest):
    model: str = Field(..., min_length=1, max_length=limits.MAX_NAME_LENGTH, title="Classifier",
                       description="A registered exported classifier or Hugging Face classifier: its architecture "
                       "and its weights are where every model of the evaluation starts training")
    dataset: str = Field(..., min_length=1, max_length=limits.MAX_PATH_LENGTH, title="Training data",
                         description="A registered dataset of the model's input: tensors (train.safetensors) for an "
                         "exported classifier, texts (train.csv or train.jsonl) for a Hugging Face one; an LDS "
                         "evaluation also needs its test split. Or such a directory under the data roots")
    recipe: ClassifierRecipe = Field(default_factory=ClassifierRecipe, title="Training recipe",
                                     description="How every model of the evaluation is trained")
    estimators: list[EstimatorName] = _estimators_field(DEFAULT_ESTIMATORS, "")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Random seed", json_schema_extra=ADVANCED,
                      description="Seed of every draw (subsets, their training, the test examples, the full-data "
                      "model; the flipped labels), of the estimators' projections and of the bootstrap")


class EvaluateClassifierAttributionRequest(_ClassifierEvaluateRequest):
    m: int = Field(32, ge=3, le=limits.MAX_EVAL_MODELS, title="Subset models",
                   description="How many models are trained on random subsets (the ground truth the scores predict)")
    alpha: float = Field(0.5, gt=0, lt=1, title="Subset share",
                         description="Share of the training examples in each subset")
    n_test: int = Field(100, ge=1, le=limits.MAX_EVAL_TEST_TRIPLES, title="Test examples evaluated",
                        description="A seeded draw from the dataset's test split (all of it when it holds fewer)")
    ensemble: int = Field(4, ge=1, le=limits.MAX_EVAL_ENSEMBLE, title="Ensemble members", json_schema_extra=ADVANCED,
                          description="Further full-data models (the recipe with other seeds) that trak_ensemble "
                          "averages over; trained only when trak_ensemble is asked for")
    replicates: bool = Field(False, title="Measure the noise ceiling", json_schema_extra=ADVANCED,
                             description="Also train every subset model again on the same subset with another seed "
                             "(m more trainings): the most any estimator's LDS can reach on this ground truth")
    shard_retries: int = shard_retries_field()

    def members(self) -> int:
        return int(self.ensemble) if any(estimators.get(e).ensemble for e in self.estimators) else 0

    def trainings(self) -> int:
        """Every model the evaluation needs: subset models, their replicates, the full-data model, members."""
        return self.m * (2 if self.replicates else 1) + 1 + self.members()


class EvaluateClassifierMislabelRequest(_ClassifierEvaluateRequest):
    estimators: list[EstimatorName] = _estimators_field(
        DEFAULT_MISLABEL_ESTIMATORS, " (not trak_ensemble: one model of the flipped labels is trained)")
    fraction: float = Field(0.1, gt=0, le=0.5, title="Flipped share",
                            description="Share of the training labels replaced by another class, drawn uniformly")


def _check_common(req: _ClassifierEvaluateRequest, settings: Settings, owner: str) -> dict[str, Any]:
    """The checks both kinds share; returns the dataset's counts (with the model's entry under ``entry``)."""
    entry = require_model(settings, req.model, MODEL_KIND, kind_label="an exported classifier", also=(HF_KIND,))
    kind = entry["kind"]
    counts = dataset_counts(settings, req.dataset, owner, kind)
    if kind == MODEL_KIND:
        spec = model_spec(entry)
        shape = list(spec["input"]["shape"][1:]) if spec is not None and "shape" in spec["input"] else None
        if shape is not None and counts.get("input_shape") not in (None, shape):
            raise FieldError(("body", "dataset"), f"the dataset's inputs are {counts['input_shape']} per example; "
                             f"model {req.model!r} takes {shape}", value=req.dataset)
    else:
        classes = class_names(settings, entry)
        if classes and counts.get("labels"):
            indices, bad = label_indices([str(v) for v in counts["labels"]], classes)
            if indices is None:
                raise FieldError(("body", "dataset"), f"the dataset's labels {bad} are not classes of model "
                                 f"{req.model!r}", value=req.dataset)
    seen: set[str] = set()
    for i, name in enumerate(req.estimators):
        if name in seen:
            raise FieldError(("body", "estimators", i), f"estimator {name!r} is named twice", value=name)
        seen.add(name)
        if name == "ekfac" and kind == MODEL_KIND:
            problem = kfac_problem(settings, entry)
            if problem is not None:
                raise FieldError(("body", "estimators", i), f"model {req.model!r}: {problem}", value=name)
    parameters = int(entry.get("parameters") or 0)
    if kind == HF_KIND:
        r = req.recipe
        need = fine_tune_bytes(parameters, (entry.get("meta") or {}).get("dims") or {}, r.batch_size, r.max_length)
        budget = memory_budget(settings, need)
        if budget and need > budget:
            raise FieldError(("body", "recipe", "batch_size"), f"fine-tuning model {req.model!r} ({parameters:,} "
                             f"parameters) on batches of {r.batch_size} texts of up to {r.max_length} tokens would "
                             f"need about {gib(need)} of worker memory, more than the {gib(budget)} a worker offers",
                             value=r.batch_size)
        return {**counts, "entry": entry}
    values = sum(int(counts.get(s) or 0) for s in ("train", "valid", "test")) * math.prod(counts.get("input_shape")
                                                                                        or [1])
    need = values * BYTES_PER_VALUE + parameters * BYTES_PER_PARAMETER
    budget = memory_budget(settings, need)
    if budget and need > budget:
        raise FieldError(("body", "dataset"), f"the dataset's {values:,} input values and model {req.model!r}'s "
                         f"{parameters:,} parameters would need about {gib(need)} of worker memory to train on, more "
                         f"than the {gib(budget)} a worker offers", value=req.dataset)
    return {**counts, "entry": entry}


def _check_budget(req: _ClassifierEvaluateRequest, counts: dict[str, Any], trainings: int,
                  models: str, related: list[tuple[tuple[Any, ...], Any]], field: tuple[Any, ...],
                  value: Any) -> None:
    """The evaluation's training epochs within ``MAX_EVAL_TRAINING_EPOCHS``, its example steps within the
    classifier trainer's ``MAX_EXAMPLE_STEPS``."""
    epochs = trainings * req.recipe.epochs
    if epochs > limits.MAX_EVAL_TRAINING_EPOCHS:
        raise FieldError(field, f"{models} x recipe.epochs {req.recipe.epochs} = {epochs} training epochs, more "
                         f"than {limits.MAX_EVAL_TRAINING_EPOCHS:,} per evaluation", value=value,
                         related=[(("body", "recipe", "epochs"), req.recipe.epochs), *related])
    steps = epochs * int(counts.get("train") or 0)
    if steps > MAX_EXAMPLE_STEPS:
        raise FieldError(field, f"{models} x recipe.epochs {req.recipe.epochs} x {int(counts['train']):,} training "
                         f"examples = {steps:,} example steps, more than {MAX_EXAMPLE_STEPS:,} per evaluation",
                         value=value, related=[(("body", "recipe", "epochs"), req.recipe.epochs), *related])


def validate_attribution(req: EvaluateClassifierAttributionRequest, settings: Settings,
                         owner: str = "system") -> None:
    counts = _check_common(req, settings, owner)
    if not int(counts.get("test") or 0):
        raise FieldError(("body", "dataset"), f"dataset {req.dataset!r} has no test split: the LDS is measured on "
                         "test examples", value=req.dataset)
    members = req.members()
    subsets = f"2 x m {req.m}" if req.replicates else f"m {req.m}"
    models = f"({subsets} + 1 + ensemble {members})" if members else f"({subsets} + 1)"
    related: list[tuple[tuple[Any, ...], Any]] = []
    if members:
        related.append((("body", "ensemble"), req.ensemble))
    if req.replicates:
        related.append((("body", "replicates"), req.replicates))
    _check_budget(req, counts, req.trainings(), models, related, ("body", "m"), req.m)


def validate_mislabel(req: EvaluateClassifierMislabelRequest, settings: Settings, owner: str = "system") -> None:
    for i, name in enumerate(req.estimators):
        if estimators.get(name).ensemble:
            raise FieldError(("body", "estimators", i), f"estimator {name!r} averages over independently trained "
                             "models and is measured by LDS only (mislabel detection trains one model)", value=name)
    counts = _check_common(req, settings, owner)
    labels = class_names(settings, counts["entry"]) or []
    if len(labels) < 2:
        raise FieldError(("body", "model"), f"model {req.model!r} records fewer than two classes: a label cannot be "
                         "flipped to another", value=req.model)
    _check_budget(req, counts, 1, "1 model", [], ("body", "recipe", "epochs"), req.recipe.epochs)


# ------------------------------------------------------------------------------------------------ estimates
REUSE = ("at most: a model an earlier evaluation of the same program, recipe and data stored (whoever ran it) is "
         "reused, not trained")


def _checkpoints(recipe: ClassifierRecipe) -> int:
    return len(set(range(recipe.checkpoint_every, recipe.epochs + 1, recipe.checkpoint_every)) | {recipe.epochs})


def _size(req: _ClassifierEvaluateRequest, counts: dict[str, Any], n: int) -> estimates.TrainingSize:
    r = req.recipe
    return estimates.TrainingSize("examples", n, r.epochs, r.batch_size, int(counts["entry"].get("parameters") or 0))


def attribution_size(req: EvaluateClassifierAttributionRequest, settings: Settings,
                     owner: str = "system") -> estimates.EvaluationSize:
    """What an LDS evaluation trains and writes, before it is submitted: ``m`` subset models on
    ``ceil(alpha x n_train)`` examples (``m`` more with ``replicates``), the full-data model, the ensemble
    members; the stored model directories (weights and checkpoints), the ground truth and the scores."""
    validate_attribution(req, settings, owner)
    counts = _check_common(req, settings, owner)
    n, n_test_split = int(counts["train"]), int(counts.get("test") or 0)
    params = int(counts["entry"].get("parameters") or 0)
    subset = min(n, max(1, math.ceil(req.alpha * n)))
    groups = [estimates.ModelGroup("subset model", req.m, _size(req, counts, subset))]
    if req.replicates:
        groups.append(estimates.ModelGroup("subset replicate", req.m, _size(req, counts, subset)))
    groups.append(estimates.ModelGroup("full-data model", 1, _size(req, counts, n)))
    if req.members():
        groups.append(estimates.ModelGroup("ensemble member", req.members(), _size(req, counts, n)))
    subsets = req.m * (2 if req.replicates else 1)
    n_test = min(req.n_test, n_test_split)
    disk = {"models": (1 + req.members()) * (1 + _checkpoints(req.recipe)) * params * estimates.FLOAT_BYTES,
            "ground_truth": subsets * (n + n_test_split * 8),
            "artifacts": req.m * n + subsets * n_test * 8
            + (len(req.estimators) * n_test * n * 8 if n_test * n <= MAX_SCORE_CELLS else 0)}
    return estimates.EvaluationSize(tuple(groups), params, disk, REUSE)


def mislabel_size(req: EvaluateClassifierMislabelRequest, settings: Settings,
                  owner: str = "system") -> estimates.EvaluationSize:
    """What a mislabel evaluation trains and writes: one model of the flipped labels, each estimator's
    self-scores."""
    validate_mislabel(req, settings, owner)
    counts = _check_common(req, settings, owner)
    n, params = int(counts["train"]), int(counts["entry"].get("parameters") or 0)
    disk = {"models": (1 + _checkpoints(req.recipe)) * params * estimates.FLOAT_BYTES,
            "artifacts": len(req.estimators) * n * 8}
    return estimates.EvaluationSize((estimates.ModelGroup("flipped-labels model", 1, _size(req, counts, n)),),
                                    params, disk, REUSE)


PICKERS = {"model": ("models", (MODEL_KIND, HF_KIND)), "dataset": ("datasets", (DATASET_KIND, TEXT_DATASET_KIND))}

register(JobKind(
    name="evaluate_classifier_attribution",
    route="/evaluate/classifier/attribution",
    request=EvaluateClassifierAttributionRequest,
    queue="bulk",
    func="workers.jobs.evaluate_classifier:run_attribution",
    # one shard per model the store lacks (subset models, replicates, the full-data model, members)
    fanout=FanOut(unit="models", shard="workers.jobs.evaluate_classifier:run_shard",
                  reduce="workers.jobs.evaluate_classifier:run_reduce", timeout_s=12 * 3600),
    timeout_s=12 * 3600,
    result_ttl_s=30 * 24 * 3600,
    summary="Linear datamodeling score (LDS) of the classifier data-attribution estimators on an exported or "
            "Hugging Face classifier, from models retrained on random subsets of the training examples",
    title="Classifier attribution quality (LDS)",
    renderer="classifier_evaluation",
    result=ClassifierLdsResult,
    sdk_method="evaluate_classifier_attribution",
    pickers=PICKERS,
    validate=validate_attribution,
    recheck=True,
    estimate=attribution_size,
))

register(JobKind(
    name="evaluate_classifier_mislabel",
    route="/evaluate/classifier/mislabel",
    request=EvaluateClassifierMislabelRequest,
    queue="bulk",
    func="workers.jobs.evaluate_classifier:run_mislabel",
    timeout_s=12 * 3600,
    result_ttl_s=30 * 24 * 3600,
    summary="Mislabel detection on a classifier: flip a fraction of the training labels, train, rank by "
            "each estimator's self-influence (ROC AUC with its interval)",
    title="Classifier mislabel detection",
    renderer="classifier_evaluation",
    result=ClassifierMislabelResult,
    sdk_method="evaluate_classifier_mislabel",
    pickers=PICKERS,
    validate=validate_mislabel,
    recheck=True,
    estimate=mislabel_size,
))
