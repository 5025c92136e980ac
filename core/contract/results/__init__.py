"""The result of a job, one pydantic model per renderer (torch-free): what ``GET /jobs/{id}/result`` serves and
documents, what the dashboard and the SDK draw.

A kind's job returns its model whether it ran whole, from stored features or as shards: the shape never depends
on how the work was split. A list that can grow with the request (the test triples of an influence query, the
samples of an attribution run, a self-influence ranking) holds its first entries inline, and every entry is in a
named artifact; ``listed[<field>]`` says how many there are in all, how many are inline and which artifact holds
them (:class:`Listed`), the same either way.

Top-level models refuse fields they do not name, so this module is the complete description of a result; the
records a pipeline writes per sample (attribution records, faithfulness numbers) are typed where clients read
them and keep the rest as they are.
"""

from __future__ import annotations

from pydantic import BaseModel

from core.contract.results.ablation import AblationResult
from core.contract.results.attributions import AttributionResult
from core.contract.results.classifier_evaluation import ClassifierEvaluationResult
from core.contract.results.classifier_influence import ClassifierInfluenceResult
from core.contract.results.evaluation import EvaluationResult
from core.contract.results.influence import InfluenceResult
from core.contract.results.training import TrainingResult

# the model each renderer draws (a kind names its renderer; its result model is this one or a subclass)
BY_RENDERER: dict[str, type[BaseModel]] = {
    "attributions": AttributionResult,
    "influence": InfluenceResult,
    "training": TrainingResult,
    "ablation": AblationResult,
    "evaluation": EvaluationResult,
    "classifier_influence": ClassifierInfluenceResult,
    "classifier_evaluation": ClassifierEvaluationResult,
}
