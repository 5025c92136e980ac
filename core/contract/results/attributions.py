"""The ``attributions`` renderer's result: Integrated Gradients over a news recommender's words, over the words of a
text given to a Hugging Face classifier, or over the pixels or features of an exported classifier's input (a
classifier's records also name the class explained and the class predicted).

One shape whether the job ran whole or as shards (``models.news.report.AttributionReport`` builds both): the first
records and errors inline, every one in a JSONL artifact (``listed``); the statistics over every sample.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from core.contract.results.base import Artifact, Listed, OpenRecord, ResultModel, Shards
from core.contract.results.provenance import PROVENANCE_DESCRIPTION, Provenance


class WordValue(OpenRecord):
    word: str
    attribution: float | None = None


class ViewRecord(OpenRecord):
    """One attributed text of a sample (the candidate's title, or another view such as its body)."""

    words: list[str]
    word_attributions: list[float | None]
    display_words: list[str] | None = None
    spans: list[list[int] | None] | None = None
    tokens: list[str] | None = None
    token_attributions: list[float | None] | None = None
    score: float | None = None
    baseline_score: float | None = None
    attribution_sum: float | None = None
    delta: float | None = None
    relative_delta: float | None = None
    top_positive: list[WordValue] = Field(default_factory=list)
    top_negative: list[WordValue] = Field(default_factory=list)


class OrderFaithfulness(OpenRecord):
    """One word ranking's numbers for one sample: comprehensiveness and sufficiency per fraction of words, the
    deletion and insertion curves (the score at each of the sample's ``points``) and their areas."""

    comprehensiveness: list[float | None]
    sufficiency: list[float | None]
    deletion: list[float | None]
    insertion: list[float | None]
    deletion_auc: float | None = None
    insertion_auc: float | None = None


class SampleFaithfulness(OpenRecord):
    """A sample's faithfulness (``faithfulness: true``): per ranking (``ig``, ``random``, ``occlusion``)."""

    n_words: int
    fractions: list[float]
    k: list[int]
    points: list[int]
    orders: dict[str, OrderFaithfulness]


class TargetClass(ResultModel):
    """The class whose logit a classifier's record explains (``score`` is that logit): its index and name, and
    ``source``: ``request`` (the text's ``target``), ``predicted`` (by default, the class the model predicts) or
    ``model`` (a ``compare_with`` record explains the class the request's model's record explains)."""

    index: int
    label: str
    source: Literal["request", "predicted", "model"]


class PredictedClass(ResultModel):
    """The class a classifier predicts for the text (the largest logit) and its softmax probability."""

    index: int
    label: str
    probability: float | None


class TensorInput(ResultModel):
    """What an exported classifier's record is drawn over: the input's ``kind`` (``image`` or ``tabular``), its
    per-example ``shape``; for an image the heatmap ``grid`` (rows, columns) of cells of ``patch`` pixels a side,
    and ``values`` each cell's mean intensity (over channels and pixels), row by row; for a tabular row each
    feature's value. The record's ``words`` name the cells (``r3c4``) or features, ``word_attributions`` are their
    attributions (summed over channels and pixels)."""

    kind: Literal["image", "tabular"]
    shape: list[int]
    grid: list[int] | None = None
    patch: int | None = None
    values: list[float | None]


class SampleRecord(ViewRecord):
    """One sample's attributions: its main view (the title, or a classifier's text) at the top level, other views
    under ``views``. With a tolerance (adaptive runs), ``n_steps`` per view, ``token_error`` per view (the
    largest change of a token's attribution at the last refinement, relative to the largest attribution: the
    stopping criterion beside completeness) and whether the sample met both (``tolerance_met``). A
    Hugging Face classifier's record also has ``target``, ``predicted`` and ``truncated`` (whether the text was cut
    to the model's maximum tokens); an exported classifier's has ``target``, ``predicted`` and ``input`` (what its
    cells or features are drawn over); a news record has ``history``."""

    id: str
    label: str | None = None
    history: list[str] | None = None
    meta: dict[str, Any] | None = None
    views: dict[str, ViewRecord] | None = None
    n_steps: dict[str, int] | None = None
    token_error: dict[str, float | None] | None = None
    tolerance_met: bool | None = None
    faithfulness: SampleFaithfulness | None = None
    target: TargetClass | None = None
    predicted: PredictedClass | None = None
    truncated: bool | None = None
    input: TensorInput | None = None


class SampleError(ResultModel):
    id: str
    error: str


class DeltaStats(ResultModel):
    """The relative completeness error's distribution (None without samples)."""

    median: float | None = None
    p95: float | None = None
    max: float | None = None


class WordStat(OpenRecord):
    word: str
    mean: float | None
    std: float | None = None
    count: int
    frequency: float | None = None


class LabelWordStats(ResultModel):
    """One label's words: the ``top`` and ``bottom`` by mean attribution, of ``words`` in all (every word is in
    the ``word_stats.json`` artifact)."""

    top: list[WordStat]
    bottom: list[WordStat]
    words: int


class TopWords(ResultModel):
    positive: list[WordStat]
    negative: list[WordStat]
    min_count: int


class AttributionSummary(ResultModel):
    """How the attributions were computed and how well they add up: the settings of the first part (a whole run
    is one part, a sharded run one per shard), counts and relative-delta statistics over every merged record,
    ``n_steps`` the largest, ``gradient_evaluations`` and the times summed over the parts, ``tolerance_met``
    when every part met it."""

    n_samples: int
    n_errors: int
    method: str | None = None
    n_steps: int | None = None
    gradient_evaluations: int | None = None
    precision: str | None = None
    baseline: str | None = None
    optimized: bool | None = None
    views: list[str] = Field(default_factory=list)
    median_relative_delta: float | None = None
    max_relative_delta: float | None = None
    relative_delta_by_view: dict[str, DeltaStats] = Field(default_factory=dict)
    tolerance: float | None = None
    tolerance_met: bool | None = None
    max_token_error: float | None = None
    batch_size: int | str | None = None
    alpha_batch_size: int | str | None = None
    seconds: float | None = None
    seconds_prepare: float | None = None


class WordChange(OpenRecord):
    word: str
    mean_before: float | None
    mean_after: float | None
    change: float | None
    count: int | None = None


class AlignedChange(OpenRecord):
    """One word of a sample whose attribution changed: its index in each model's record (``index_a``: the
    model's, ``index_b``: ``compare_with``'s), its attribution ``before`` and ``after``."""

    word: str
    index_a: int
    index_b: int
    before: float | None
    after: float | None
    change: float | None


class SampleChanges(OpenRecord):
    """One sample under both models: its words aligned by character span and the largest changes."""

    id: str | None
    aligned: int
    words_a: int
    words_b: int
    changed: list[AlignedChange]


class NewTopWord(ResultModel):
    """A word among ``compare_with``'s top-positive words in ``count`` samples and in none of the model's."""

    word: str
    count: int


class ModelAttributions(ResultModel):
    """One model's attributions of the samples: its records (the first ones inline), the samples it could not
    attribute, how they were computed and how well they add up, and its word statistics per label."""

    model: str
    n_samples: int
    n_errors: int
    samples: list[SampleRecord]
    errors: list[SampleError]
    summary: AttributionSummary
    relative_delta: DeltaStats
    relative_delta_by_view: dict[str, DeltaStats]
    word_stats: dict[str, LabelWordStats]


class Comparison(ModelAttributions):
    """The same samples attributed under ``compare_with``: which words' mean attribution moved (``changed``: the
    first ``CHANGED_INLINE`` of ``changed_total`` by size, every one in ``comparison.json``), and its own records,
    errors, summary and statistics, as the result has them for the model (``samples``: the first ones, every one
    in ``compare.jsonl``; ``per_sample``: the inline samples attributed by both, in the model's order)."""

    threshold: float
    min_count: int
    changed_min_count: int
    top_n: int
    changed: list[WordChange]
    changed_total: int
    new_top_words: list[NewTopWord]
    per_sample: list[SampleChanges]


class OrderSummary(ResultModel):
    """One word ranking over the samples: mean comprehensiveness and sufficiency per fraction, mean curve
    areas."""

    n: int
    comprehensiveness: list[float | None]
    sufficiency: list[float | None]
    deletion_auc: float | None
    insertion_auc: float | None


class MeanCurves(ResultModel):
    deletion: list[float | None]
    insertion: list[float | None]


class PairedTest(ResultModel):
    """A one-sided Wilcoxon signed-rank test of IG against another ranking, paired per sample: its p-value, the
    Holm-adjusted one over the section's family of tests (``p_holm``; ``significant_holm`` at the section's
    ``alpha``), and the effect size in IG's favour (matched-pairs rank-biserial correlation, -1 to 1) with a 95%
    bootstrap interval over samples (None in results written before they were computed)."""

    metric: str
    against: str
    n: int
    n_nonzero: int
    median_difference: float | None
    alternative: str
    statistic: float | None
    p_value: float | None
    p_holm: float | None = None
    significant_holm: bool | None = None
    effect_rank_biserial: float | None = None
    effect_interval: list[float] | None = None


class FaithfulnessSection(ResultModel):
    """Faithfulness over the samples (``faithfulness: true``; ``models.explain.faithfulness.summarize``): per
    ranking the mean numbers (``orders``) and mean curves (``curves``: ``fraction``, the grid, then one
    ``{deletion, insertion}`` per ranking), the tests, the settings, and the time it took (``seconds``,
    ``cpu_seconds``; summed over a sharded run's shards) against the attribution's (``attribution_seconds``)."""

    n_samples: int
    fractions: list[float]
    orders: dict[str, OrderSummary]
    curves: dict[str, list[float | None] | MeanCurves]
    tests: list[PairedTest]
    alpha: float | None = None
    view: str | None
    seed: int
    baseline: str
    max_curve_points: int
    seconds: float | None
    cpu_seconds: float | None
    attribution_seconds: float | None
    time_ratio: float | None


class AttributionResult(ModelAttributions):
    """Integrated Gradients over a news recommender or a Hugging Face classifier (``POST /attributions``): per
    sample the words of its candidate (or text) coloured by attribution (``samples``: the first ``SAMPLES_INLINE`` inline, all in
    ``samples.jsonl``), and over the samples the completeness error, the word statistics per label (``word_stats``:
    each label's top and bottom words, all in ``word_stats.json``) and the top words. ``errors`` holds the first
    ``ERRORS_INLINE`` of ``n_errors`` samples that could not be attributed (all in ``errors.jsonl``). ``listed``
    describes the lists held in part: ``samples`` and ``errors``, and with ``compare_with``
    ``comparison.samples`` and ``comparison.errors``. ``shards`` is None for a whole run."""

    top_words: TopWords
    labels: list[tuple[str, int]]
    warnings: list[str]
    warn_relative_delta: float
    faithfulness: FaithfulnessSection | None = None
    comparison: Comparison | None = None
    listed: dict[str, Listed]
    shards: Shards | None = None
    artifacts: list[Artifact] = Field(default_factory=list)
    provenance: Provenance | None = Field(None, description=PROVENANCE_DESCRIPTION)
