"""``GET /compare?a=&b=``: two succeeded jobs of one kind side by side (``core/compare.py`` computes it).

Attributions: the samples both attributed, matched by id (each model's score, the delta and the change of the
sample's rank by score; per word of a sample whose words are the same under both models, both attributions, the
delta and the change of the word's rank in the sample) and every word over the matched samples (each model's mean
attribution, the delta, the change of rank). TracIn: the test triples both explained, matched by triple (per list,
the overlap of the top k, Spearman and Kendall rank correlation on the union, what entered and left). Training:
both runs' histories and step curves for one overlay, the last epoch's metrics and the request fields that differ.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from core.contract.results.base import ResultModel, Triple
from core.contract.results.training import StepPoint


class ComparedJob(ResultModel):
    """One of the two jobs: what names it and what produced it (its provenance's first model digest)."""

    id: str
    kind: str
    label: str | None = None
    model: str | None = Field(None, description="the model the result names (a training run: the one registered)")
    model_digest: str | None = Field(None, description="SHA-256 of the model version (its provenance's)")
    estimator: str | None = None
    finished_at: str | None = None


# ------------------------------------------------------------------------------------------------ attributions
class WordDelta(ResultModel):
    """One word of a sample under both models: its position, both attributions, ``delta`` (b − a) and its rank
    in the sample by attribution (1: the most positive) under each model; ``rank_change`` = rank_a − rank_b
    (positive: the word moved up under b)."""

    position: int
    word: str
    a: float | None
    b: float | None
    delta: float | None
    rank_a: int
    rank_b: int
    rank_change: int


class SampleDelta(ResultModel):
    """A sample both jobs attributed: each model's score F(x) and the sum of its attributions, the deltas (b −
    a), the sample's rank by score among the matched samples under each model (1: the highest) and
    ``rank_change`` (rank_a − rank_b). ``words_match``: both records have the same words, so ``words`` holds
    each word's two attributions; otherwise (other tokenizers) the words are compared over the vocabulary only."""

    id: str
    label: str | None = None
    score_a: float | None
    score_b: float | None
    score_delta: float | None
    attribution_sum_a: float | None
    attribution_sum_b: float | None
    rank_a: int | None
    rank_b: int | None
    rank_change: int | None
    words_match: bool
    largest_change: WordDelta | None = Field(None, description="the word whose attribution changed most")
    words: list[WordDelta] = Field(default_factory=list)


class VocabularyDelta(ResultModel):
    """A word over the matched samples: how often each model's records hold it, its mean attribution under each,
    ``delta`` (b − a), its rank among all words by mean attribution under each model (1: the most positive) and
    ``rank_change`` (rank_a − rank_b). No minimum count: a rare word that moved a lot is listed by its delta, with
    its counts beside it."""

    word: str
    count_a: int
    count_b: int
    mean_a: float | None
    mean_b: float | None
    delta: float | None
    rank_a: int | None
    rank_b: int | None
    rank_change: int | None


class AttributionComparison(ResultModel):
    """The attribution runs side by side. ``samples`` in a's order (the first ``samples_inline`` of ``matched``),
    ``words`` by the size of their delta (the first ``words_inline`` of ``words_total``). ``only_a`` /
    ``only_b``: ids attributed by one job only (the first 100 of ``n_only_a`` / ``n_only_b``).
    ``score_spearman``: the rank correlation of the two models' scores over the matched samples.
    ``read``: per job, how many records were read (``read_limit`` at most) of how many the run has."""

    matched: int
    n_only_a: int
    n_only_b: int
    only_a: list[str]
    only_b: list[str]
    score_spearman: float | None
    mean_abs_score_delta: float | None
    samples_inline: int
    samples: list[SampleDelta]
    words_total: int
    words_inline: int
    words: list[VocabularyDelta]
    read: dict[str, list[int]] = Field(description="per job ('a', 'b'): [records read, records the run has]")
    read_limit: int


# ------------------------------------------------------------------------------------------------------ tracin
class RankedTriple(ResultModel):
    """A training triple of either list: its rank and influence in each (None: not in that list),
    ``change``: ``stayed`` (in both lists' top k), ``entered`` (in b's top k, not a's) or ``left`` (in a's, not
    b's); ``beyond`` when it is in the top k of neither but in one of the longer list's tail."""

    train_triple: Triple
    rank_a: int | None
    rank_b: int | None
    influence_a: float | None
    influence_b: float | None
    change: Literal["stayed", "entered", "left", "beyond"]


class ListComparison(ResultModel):
    """One ranked list under both jobs (``proponents``, ``opponents`` or mode self's ``ranking``).

    ``k`` = the shorter list's length; ``overlap`` = how many training triples both top-k lists hold
    (``overlap_fraction`` = overlap / k). ``spearman`` and ``kendall`` (tau-b) are computed on the union of
    both lists: a triple missing from a list is ranked after that list's last entry (all such tied), the usual
    treatment of top-k lists, so the correlation describes the lists as shown, not the full rankings.
    ``triples``: the union, by a's rank then b's."""

    role: Literal["proponents", "opponents", "ranking"]
    length_a: int
    length_b: int
    k: int
    overlap: int
    overlap_fraction: float | None
    union: int
    spearman: float | None
    kendall: float | None
    entered: int
    left: int
    triples: list[RankedTriple]


class TestComparison(ResultModel):
    """A test triple both jobs explained: each model's prediction (score, filtered rank) and its lists."""

    test_triple: Triple
    score_a: float | None = None
    score_b: float | None = None
    rank_a: float | None = None
    rank_b: float | None = None
    lists: list[ListComparison]


class InfluenceComparison(ResultModel):
    """The TracIn (or TRAK...) runs side by side, on the test triples both explained (``matched``; mode test) or
    on their self-influence rankings (mode self): per test triple and list the overlap, rank correlations,
    entries and exits; ``mean_overlap_fraction`` and ``mean_spearman`` over every list compared."""

    mode: Literal["test", "self"]
    estimator_a: str
    estimator_b: str
    loss_a: str
    loss_b: str
    matched: int
    n_only_a: int
    n_only_b: int
    only_a: list[Triple]
    only_b: list[Triple]
    tests: list[TestComparison] = Field(default_factory=list)
    ranking: ListComparison | None = None
    mean_overlap_fraction: float | None
    mean_spearman: float | None
    read: dict[str, list[int]] = Field(description="per job ('a', 'b'): [entries read, entries the run has]")
    read_limit: int


# ---------------------------------------------------------------------------------------------------- training
class MetricDelta(ResultModel):
    """A numeric metric of the last history row both runs have: each run's value and ``delta`` (b − a)."""

    key: str
    a: float | None
    b: float | None
    delta: float | None


class FieldDelta(ResultModel):
    """A request field (dotted) whose value differs between the two runs (absent: None)."""

    field: str
    a: Any = None
    b: Any = None


class TrainingComparison(ResultModel):
    """Both runs' per-epoch histories (rows as the kind's charts read them, nested values flattened with ``_``)
    and per-step curves, for one overlay; the last row's metrics side by side; the request fields that differ."""

    history_a: list[dict[str, Any]]
    history_b: list[dict[str, Any]]
    steps_a: list[StepPoint]
    steps_b: list[StepPoint]
    metrics: list[MetricDelta]
    changed_fields: list[FieldDelta]


class ComparisonResult(ResultModel):
    """Two succeeded jobs of one kind side by side (``GET /compare?a=&b=``): the section of the kind's renderer
    (``attributions``, ``influence`` or ``training``) filled, the others None. Deltas are always b − a."""

    kind: str
    renderer: Literal["attributions", "influence", "training"]
    a: ComparedJob
    b: ComparedJob
    attributions: AttributionComparison | None = None
    influence: InfluenceComparison | None = None
    training: TrainingComparison | None = None
    notes: list[str] = Field(default_factory=list, description="what the comparison leaves out, and why")
