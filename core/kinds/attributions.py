"""``POST /attributions``: Integrated Gradients (or occlusion) over the words of a news headline, or of a text given
to a Hugging Face sequence classifier.

API side only: request schema and checks that need the registry. Never imports torch. What a request takes depends
on the model's registry kind: a ``news`` recommender takes ``samples`` or ``dataset`` (a history and a candidate
headline per sample), an ``hf_classifier`` takes ``texts`` (a text and, optionally, the class to explain); anything
else is a 422 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr

from core import limits, registry
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
from models.explain.rules import METHODS as RULES
from models.explain.rules import NEEDS_TWO, default_method

METHODS = (*RULES, "occlusion")
MODEL_KIND = "news"
HF_KIND = "hf_classifier"
EXPORT_KIND = "exported_classifier"
MODEL_KINDS = {MODEL_KIND: "a news recommender", HF_KIND: "a Hugging Face classifier",
               EXPORT_KIND: "an exported classifier"}
DATASET_KIND = "news"
BASELINES = ("pad", "mask", "zero", "mean", "blur", "custom")
NEWS_BASELINES = ("pad", "zero")
HF_BASELINES = ("pad", "mask", "zero")
EXPORT_BASELINES = ("zero", "mean", "blur", "custom")
TOKEN_BASELINES = ("pad", "mask", "zero")  # an exported classifier over token ids (spec.input.kind "tokens")

Title = Annotated[StrictStr, Field(min_length=1, max_length=limits.MAX_TITLE_LENGTH)]
BodyText = Annotated[StrictStr, Field(max_length=limits.MAX_BODY_TEXT_LENGTH)]
SampleId = Annotated[StrictStr, Field(min_length=1, max_length=limits.MAX_SAMPLE_ID_LENGTH)]
ClassName = Annotated[StrictStr, Field(min_length=1, max_length=limits.MAX_CLASS_NAME_LENGTH)]
ClassIndex = Annotated[StrictInt, Field(ge=0, le=limits.MAX_CLASS_INDEX)]


class SampleIn(RequestModel):
    id: SampleId = Field(
        ..., title="Sample id",
        description="A name for the sample, unique in the request")
    history: list[Title] = Field(min_length=1, max_length=limits.MAX_HISTORY, title="Reading history",
        description="Titles the user clicked, one per line")
    candidate: Title = Field(..., title="Candidate headline",
        description="The headline whose score is explained")
    label: Literal["real", "fake"] | None = Field(None, title="True label",
        description="Whether the candidate is real or fake news, when known")
    candidate_body: BodyText | None = Field(None, title="Candidate body text",
        description="The article's body, for models that read it (NAML)")
    history_bodies: list[BodyText] | None = Field(
        None, max_length=limits.MAX_HISTORY, title="History body texts",
        description="One body per history title, for models that read them (NAML)")


class TextIn(RequestModel):
    id: SampleId = Field(..., title="Text id", description="A name for the text, unique in the request")
    text: Annotated[StrictStr, Field(min_length=1, max_length=limits.MAX_TEXT_LENGTH)] = Field(
        ..., title="Text", description="The text the classifier reads (truncated to the model's maximum tokens)")
    label: ClassName | None = Field(None, title="True label",
        description="The text's class as you know it, when known (groups the word statistics)")
    target: ClassIndex | ClassName | None = Field(None, title="Class to explain",
        description="A class index or class name of the model; by default the class the model predicts")


class TensorIn(RequestModel):
    id: SampleId = Field(..., title="Input id", description="A name for the input, unique in the request")
    values: list[Any] = Field(
        ..., min_length=1, max_length=limits.MAX_INPUT_VALUES, title="Values",
        description=("The input as nested lists of numbers in the model's per-example shape (an image "
                     "[channels][height][width], a tabular row [features]), without the batch dimension"))
    label: ClassName | None = Field(None, title="True label",
        description="The input's class as you know it, when known (groups the statistics)")
    target: ClassIndex | ClassName | None = Field(None, title="Class to explain",
        description="A class index or class name of the model; by default the class the model predicts")


class DatasetIn(RequestModel):
    name: str = Field(min_length=1, max_length=limits.MAX_NAME_LENGTH, title="Dataset name",
        description="A registered news dataset")
    split: Literal["train", "valid", "test"] = Field("test", title="Dataset split",
        description="Which part of the dataset to draw the samples from")
    n_samples: int = Field(32, ge=1, le=limits.MAX_DATASET_SAMPLES, title="Number of samples",
        description="How many samples to draw; a large run is split over the workers")
    balanced: bool = Field(False, title="Balance real and fake",
        description="Draw as many real as fake candidates (the split needs labels)")
    seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Random seed",
        description="Seed of the draw, for a repeatable selection")


class AttributionsRequest(JobRequest):
    model: str = Field(min_length=1, max_length=limits.MAX_NAME_LENGTH, title="Model to explain",
        description=("The news recommender whose score for the candidate is explained, or the Hugging Face "
                     "classifier whose class logit for each text is explained"))
    samples: list[SampleIn] | None = Field(None, min_length=1, max_length=limits.MAX_SAMPLES, title="Headlines to explain",
        description="Users (their reading history) and a candidate headline each; or draw samples from a dataset")
    dataset: DatasetIn | None = Field(None, title="Samples from a dataset",
        description="Draw the samples from a registered news dataset instead of typing them")
    texts: list[TextIn] | None = Field(
        None, min_length=1, max_length=limits.MAX_SAMPLES, title="Texts to explain",
        description="For a Hugging Face classifier: the texts whose class logit is explained (not samples or dataset)")
    inputs: list[TensorIn] | None = Field(
        None, min_length=1, max_length=limits.MAX_SAMPLES, title="Inputs to explain",
        description=("For an exported classifier: the images or tabular rows whose class logit is explained, each "
                     "in the model's per-example shape; for one over token ids, each input's ids (its values: a "
                     "list of integers, padded with the spec's pad_id where its length is fixed)"))
    n_steps: int = Field(64, ge=1, le=limits.MAX_IG_STEPS, title="Integration steps",
        description=("Points on the path from the baseline to the headline: more steps, more exact attributions, a "
                     "longer run"))
    method: Literal[METHODS] | None = Field(
        None, title="Integration rule", json_schema_extra=ADVANCED,
        description=("How the path integral is approximated: Gauss-Legendre by default, Clenshaw-Curtis (nested "
                     "levels) when a target error is set"))
    tolerance: float | None = Field(
        None, gt=0, lt=1, title="Target completeness error", json_schema_extra=ADVANCED,
        description=("Refine each sample, from 16 steps up to the integration steps, until its attributions add up to "
                     "the score difference within this relative error"))
    alpha_batch_size: Annotated[int, Field(le=limits.MAX_ALPHA_BATCH_SIZE)] | Literal["auto"] = Field(
        "auto", title="Path points per pass", json_schema_extra=ADVANCED,
        description="Points of the path computed together; 'auto' sizes it from the model's measured memory")
    batch_size: Annotated[int, Field(le=limits.MAX_IG_BATCH_SIZE)] | Literal["auto"] = Field(
        "auto", title="Samples per pass", json_schema_extra=ADVANCED,
        description="Samples computed together; 'auto' sizes it from the model's measured memory")
    precision: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto", title="Numeric precision", json_schema_extra=ADVANCED,
        description="Floating-point format of the model's passes; 'auto' picks what suits the device")
    baseline: Literal[BASELINES] | None = Field(
        None, title="Reference input", json_schema_extra=ADVANCED,
        description=("What the input is compared with. Text: the padding token's embedding at its word positions "
                     "('pad', the default), the mask token's ('mask': Hugging Face classifiers whose tokenizer has "
                     "one) or zeros ('zero'). Exported classifiers: zeros ('zero', the default), the training mean "
                     "of the model's spec ('mean'), the image blurred ('blur') or baseline_values ('custom')"))
    baseline_values: list[Any] | None = Field(
        None, min_length=1, max_length=limits.MAX_INPUT_VALUES, title="Custom reference input", json_schema_extra=ADVANCED,
        description="With baseline 'custom' (exported classifiers): one input's values, the reference of every input")
    top_k: int = Field(
        10, ge=0, le=limits.MAX_ATTRIBUTION_TOP_K, title="Top words listed", json_schema_extra=ADVANCED,
        description="How many of each sample's most influential words the result lists")
    optimized: bool = Field(True, title="Fast implementation", json_schema_extra=ADVANCED,
        description="Batched computation; off runs the plain reference loop (for checking)")
    compare_with: str | None = Field(
        None, min_length=1, max_length=limits.MAX_NAME_LENGTH, title="Compare with model",
        description=("A second model of the same kind (a poisoned twin, say; for a classifier, one with the same class "
                     "names, explaining the same class) whose attributions are compared word by word"))
    compare_threshold: float = Field(
        0.1, ge=0, title="Change threshold", json_schema_extra=ADVANCED,
        description="The comparison table lists words whose mean attribution moved by more than this")
    compare_min_count: int = Field(
        3, ge=1, le=limits.MAX_COMPARE_MIN_COUNT, title="Fewest sightings of a compared word", json_schema_extra=ADVANCED,
        description="The comparison table lists only words seen at least this many times under both models")
    compare_top_n: int = Field(
        3, ge=1, le=limits.MAX_COMPARE_TOP_N, title="Changed words marked per sample",
        description="Per sample, the words whose attribution changed most between the two models are marked")
    warn_relative_delta: float = Field(
        0.05, gt=0, title="Completeness warning above", json_schema_extra=ADVANCED,
        description=("A sample whose attributions miss the score difference by more than this relative error is "
                     "flagged, in the warnings and on its page"))
    max_history: int = Field(
        50, ge=1, le=limits.MAX_HISTORY, title="History titles read", json_schema_extra=ADVANCED,
        description="How many of the most recent history titles the model reads (news recommenders)")
    faithfulness: StrictBool = Field(
        False, title="Measure faithfulness",
        description=("Per sample, comprehensiveness and sufficiency at 1/5/10/20/50% of the words and deletion/insertion "
                     "curves, for IG's word ranking, a seeded random one and occlusion's"))
    faithfulness_seed: int = Field(0, ge=0, le=limits.MAX_SEED, title="Random-ranking seed", json_schema_extra=ADVANCED,
                                   description="Seed of the random word ranking faithfulness is compared with")
    shard_size: ShardSize = shard_size_field("samples")
    max_failed_fraction: float = max_failed_field("samples")
    shard_retries: int = shard_retries_field()


def baseline_of(req: AttributionsRequest) -> str:
    """The request's baseline, or its model family's default: ``zero`` for an exported classifier's ``inputs``,
    ``pad`` for text."""
    return req.baseline or ("zero" if req.inputs is not None else "pad")


def _check_models(req: AttributionsRequest, settings: Settings) -> dict[str, Any]:
    """``model`` is a registered news recommender or Hugging Face classifier, and ``compare_with`` (when given) a
    model of the same kind (for classifiers, with the same class names). Returns the model's registry entry."""
    entry = registry.get_model(settings, req.model)
    if entry is None or entry.get("kind") not in MODEL_KINDS:
        entry = require_model(settings, req.model, MODEL_KIND, kind_label=" or ".join(MODEL_KINDS.values()))
    kind = entry["kind"]
    if req.compare_with is not None:
        other = require_model(settings, req.compare_with, kind, field="compare_with", kind_label=(
            f"{MODEL_KINDS[kind]} like model {req.model!r}"))
        if kind == EXPORT_KIND:
            mine_spec, their_spec = model_spec(entry), model_spec(other)

            def takes(s: dict[str, Any]) -> tuple[Any, ...]:  # what an input of the model is
                i = s["input"]
                return (i.get("kind"), i.get("shape"), i.get("vocab_size"), i.get("max_tokens"))

            if mine_spec is not None and their_spec is not None and takes(mine_spec) != takes(their_spec):
                def shown_spec(s: dict[str, Any]) -> str:
                    i = s["input"]
                    return f"{i.get('kind')} inputs of shape {i.get('shape')}" + (
                        f" over {i.get('vocab_size')} token ids" if i.get("kind") == "tokens" else "")

                raise FieldError(("body", "compare_with"), f"classifier {req.compare_with!r} takes "
                                 f"{shown_spec(their_spec)} and {req.model!r} {shown_spec(mine_spec)}: a comparison "
                                 "needs the same input spec", value=req.compare_with)
        if kind in (HF_KIND, EXPORT_KIND):
            mine, theirs = class_names(settings, entry), class_names(settings, other)
            if mine is not None and theirs is not None and sorted(mine) != sorted(theirs):
                raise FieldError(("body", "compare_with"), f"classifier {req.compare_with!r} has the classes "
                                 f"{_shown(theirs)} and {req.model!r} has {_shown(mine)}: a comparison explains the "
                                 "same class under both models, so they need the same class names",
                                 value=req.compare_with)
    return entry


def _shown(names: list[str], n: int = 10) -> str:
    return "[" + ", ".join(repr(v) for v in names[:n]) + (", ..." if len(names) > n else "") + "]"


_MODEL_FILES: dict[tuple, Any] = {}  # (model version, question) -> answer (versions are immutable)


def _ask_model_files(settings: Settings, entry: dict[str, Any], name: str, args: dict[str, Any], shown: str) -> Any:
    """What the bounded parser ``name`` reads from a registered model's files (never read in this process), once
    per model version."""
    version = (f"{entry.get('location') or entry.get('path')}|{entry.get('created_at')}", name,
               *sorted(args.items()))
    if version not in _MODEL_FILES:
        answer = run_bounded(settings, name, {"entry": entry, **args}, loc=("body", "model"),
                             value=entry.get("name"), shown=f"{entry.get('name')}/{shown}")
        raise_if_store_down(answer)
        if len(_MODEL_FILES) > 256:
            _MODEL_FILES.clear()
        _MODEL_FILES[version] = answer
    return _MODEL_FILES[version]


def class_names(settings: Settings, entry: dict[str, Any]) -> list[str] | None:
    """A classifier's class names in logit order: its registry meta's ``labels`` (what the import records), else
    its config.json's ``id2label`` (read in the bounded parser); None when neither can be read."""
    labels = (entry.get("meta") or {}).get("labels")
    if isinstance(labels, list) and labels and all(isinstance(v, str) for v in labels):
        return labels
    return _ask_model_files(settings, entry, "model.class_names", {}, "config.json")


def tokenizer_has(settings: Settings, entry: dict[str, Any], token: str) -> bool | None:
    """Whether a classifier's tokenizer defines ``token`` (``pad``, ``mask``), from tokenizer_config.json or
    special_tokens_map.json (what transformers reads it from, in the bounded parser); None when neither can be
    read."""
    return _ask_model_files(settings, entry, "model.tokenizer_has", {"token": token}, "tokenizer_config.json")


def _check_news_inputs(req: AttributionsRequest, settings: Settings) -> None:
    """A news recommender reads samples (or a dataset's), never texts, with a pad or zero baseline."""
    if req.texts is not None:
        raise FieldError(("body", "texts"), f"model {req.model!r} is a news recommender: give samples (a reading "
                         "history and a candidate headline each) or dataset; texts are for Hugging Face "
                         "classifiers", value=None)
    _refuse_inputs(req, "a news recommender")
    if (req.samples is None) == (req.dataset is None):
        raise FieldError(("body", "samples"), "give exactly one of samples or dataset", value=None)
    if req.samples is not None:
        _check_samples(req.samples)
    if req.dataset is not None:
        _check_dataset(req.dataset, settings)
    if baseline_of(req) not in NEWS_BASELINES:
        raise FieldError(("body", "baseline"), f"baseline {req.baseline!r} is not for news recommenders; a news "
                         f"recommender takes {' or '.join(NEWS_BASELINES)}", value=req.baseline)


def _refuse_inputs(req: AttributionsRequest, what: str) -> None:
    for name in ("inputs", "baseline_values"):
        if getattr(req, name) is not None:
            raise FieldError(("body", name), f"model {req.model!r} is {what}: {name} is for exported classifiers",
                             value=None)


def _own_items(req: AttributionsRequest, what: str, own: str, hint: str, others: tuple[str, ...]) -> None:
    """A classifier reads its own items (``own``: texts or inputs), never the other families' nor a history
    length."""
    for name in others:
        if getattr(req, name) is not None:
            raise FieldError(("body", name), f"model {req.model!r} is {what}: give {own} ({hint}); {name} is for "
                             "other models", value=None)
    if "max_history" in req.model_fields_set:
        raise FieldError(("body", "max_history"), f"model {req.model!r} is {what}: it reads no history "
                         "(max_history is for news recommenders)", value=req.max_history)
    if getattr(req, own) is None:
        raise FieldError(("body", own), f"model {req.model!r} is {what}: give {own} ({hint})", value=None)


def _check_hf_inputs(req: AttributionsRequest, settings: Settings, entry: dict[str, Any]) -> None:
    """A Hugging Face classifier reads texts (never news samples, a news dataset or a history length); each target
    is a class of the model, and the baseline's token is one its tokenizer has."""
    _own_items(req, "a Hugging Face classifier", "texts", "{id, text} each", ("samples", "dataset"))
    _refuse_inputs(req, "a Hugging Face classifier")
    if baseline_of(req) not in HF_BASELINES:
        raise FieldError(("body", "baseline"), f"baseline {req.baseline!r} is not for text classifiers; a Hugging "
                         f"Face classifier takes {' or '.join(HF_BASELINES)}", value=req.baseline)
    seen: set[str] = set()
    labels = class_names(settings, entry)
    for i, t in enumerate(req.texts):
        if t.id in seen:
            raise FieldError(("body", "texts", i, "id"), f"duplicate text id {t.id!r}", value=t.id)
        seen.add(t.id)
        _check_target(("body", "texts", i, "target"), t.target, labels, req.model)
    if baseline_of(req) != "zero":
        for name in filter(None, (req.model, req.compare_with)):
            other = entry if name == req.model else registry.get_model(settings, name)
            base = baseline_of(req)
            if other is not None and tokenizer_has(settings, other, base) is False:
                raise FieldError(("body", "baseline"), f"baseline {base!r}: the tokenizer of model {name!r} "
                                 f"has no {base} token; choose "
                                 + " or ".join(repr(b) for b in HF_BASELINES if b != base), value=req.baseline)


def _check_target(loc: tuple, target: int | str | None, labels: list[str] | None, model: str) -> None:
    """An item's class to explain is an index or a name of the model's classes (unchecked when they are unknown)."""
    if target is None or labels is None:
        return
    if isinstance(target, int) and target >= len(labels):
        raise FieldError(loc, f"class index {target} is not one of model {model!r}'s {len(labels)} classes "
                         f"(0..{len(labels) - 1})", value=target)
    if isinstance(target, str) and target not in labels:
        raise FieldError(loc, f"{target!r} is not a class of model {model!r} (its classes: {_shown(labels)})",
                         value=target)


def model_spec(entry: dict[str, Any]) -> dict[str, Any] | None:
    """An exported classifier's checked spec, as its import recorded it in the registry (None when absent)."""
    spec = (entry.get("meta") or {}).get("spec")
    return spec if isinstance(spec, dict) and isinstance(spec.get("input"), dict) else None


def values_problem(values: Any, shape: list[int]) -> tuple[tuple[int, ...], str] | None:
    """Why nested lists ``values`` are not finite numbers of ``shape`` (the index path where it goes wrong and the
    reason), or None. Iterative: the depth is the shape's."""
    import math

    stack: list[tuple[Any, tuple[int, ...]]] = [(values, ())]
    while stack:
        v, at = stack.pop()
        depth = len(at)
        if depth == len(shape):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                return at, "must be a finite number"
            continue
        if not isinstance(v, list):
            return at, f"must be a list of {shape[depth]} (the shape is {shape})"
        if len(v) != shape[depth]:
            return at, f"has {len(v)} entries; the model's input has {shape[depth]} there (the shape is {shape})"
        stack.extend((item, (*at, i)) for i, item in enumerate(v))
    return None


def ids_problem(values: list[Any], spec_input: dict[str, Any]) -> tuple[tuple[int, ...], str] | None:
    """Why ``values`` are not token ids a token model reads (the index path where it goes wrong and the reason),
    or None: integers (no booleans) in ``0..vocab_size - 1``, as many as its fixed length, or ``min_tokens`` to
    ``max_tokens`` where its length is dynamic."""
    vocab = spec_input.get("vocab_size")
    longest = spec_input.get("max_tokens")
    fixed = spec_input.get("shape", [None, None])[-1] != "tokens"
    shortest = longest if fixed else spec_input.get("min_tokens", 1)
    if isinstance(longest, int) and fixed and len(values) != longest:
        return (), f"has {len(values)} token ids; the model reads exactly {longest} (pad with its pad_id)"
    if isinstance(longest, int) and not shortest <= len(values) <= longest:
        return (), f"has {len(values)} token ids; the model reads {shortest} to {longest}"
    for j, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int):
            return (j,), "must be a token id (an integer)"
        if isinstance(vocab, int) and not 0 <= v < vocab:
            return (j,), f"is {v}, not a token id of the model's vocabulary (0..{vocab - 1})"
    return None


def _check_token_baseline(req: AttributionsRequest, settings: Settings, entry: dict[str, Any]) -> None:
    """A token model's baseline is pad, mask or zero, with the token its spec (and compare_with's) declares."""
    base = baseline_of(req)
    if base not in TOKEN_BASELINES:
        raise FieldError(("body", "baseline"), f"baseline {base!r} is not for token inputs; model {req.model!r} "
                         f"reads token ids and takes {', '.join(TOKEN_BASELINES)}", value=req.baseline)
    if req.baseline_values is not None:
        raise FieldError(("body", "baseline_values"), f"model {req.model!r} reads token ids: its baselines are "
                         f"{', '.join(TOKEN_BASELINES)}, not baseline_values", value=None)
    if base == "zero":
        return
    for name in filter(None, (req.model, req.compare_with)):
        other = entry if name == req.model else registry.get_model(settings, name)
        other_spec = model_spec(other) if other is not None else None
        if other_spec is not None and other_spec["input"].get(f"{base}_id") is None:
            raise FieldError(("body", "baseline"), f"baseline {base!r}: model {name!r}'s spec declares no "
                             f"{base}_id; choose " + " or ".join(repr(b) for b in TOKEN_BASELINES if b != base),
                             value=req.baseline)


def _check_export_inputs(req: AttributionsRequest, settings: Settings, entry: dict[str, Any]) -> None:
    """An exported classifier reads inputs of its spec's shape (token ids of its vocabulary); each target is one
    of its classes; the baseline is one its input kind and spec have."""
    spec = model_spec(entry)
    if spec is not None and spec["input"].get("kind") == "tokens":
        _own_items(req, "an exported classifier over token ids", "inputs", "{id, values} each, values the token "
                   "ids: the service has no tokenizer for an exported program, so texts are tokenized by the "
                   "caller", ("samples", "dataset", "texts"))
        labels = class_names(settings, entry)
        seen: set[str] = set()
        for i, t in enumerate(req.inputs):
            if t.id in seen:
                raise FieldError(("body", "inputs", i, "id"), f"duplicate input id {t.id!r}", value=t.id)
            seen.add(t.id)
            problem = ids_problem(t.values, spec["input"])
            if problem is not None:
                at, why = problem
                raise FieldError(("body", "inputs", i, "values", *at), f"values{''.join(f'[{j}]' for j in at)} "
                                 f"{why}", value=None)
            _check_target(("body", "inputs", i, "target"), t.target, labels, req.model)
        _check_token_baseline(req, settings, entry)
        return
    _own_items(req, "an exported classifier", "inputs", "{id, values} each, in the model's per-example shape",
               ("samples", "dataset", "texts"))
    shape = list(spec["input"]["shape"][1:]) if spec is not None else None
    labels = class_names(settings, entry)
    seen: set[str] = set()
    for i, t in enumerate(req.inputs):
        if t.id in seen:
            raise FieldError(("body", "inputs", i, "id"), f"duplicate input id {t.id!r}", value=t.id)
        seen.add(t.id)
        if shape is not None:
            problem = values_problem(t.values, shape)
            if problem is not None:
                at, why = problem
                raise FieldError(("body", "inputs", i, "values", *at), f"values{''.join(f'[{j}]' for j in at)} "
                                 f"{why}", value=None)
        _check_target(("body", "inputs", i, "target"), t.target, labels, req.model)
    base = baseline_of(req)
    if base not in EXPORT_BASELINES:
        raise FieldError(("body", "baseline"), f"baseline {base!r} is for text models; an exported classifier of "
                         f"{spec['input'].get('kind') if spec else 'tensor'} inputs takes "
                         f"{', '.join(EXPORT_BASELINES)}", value=req.baseline)
    if base == "custom":
        if req.baseline_values is None:
            raise FieldError(("body", "baseline_values"), "baseline 'custom' needs baseline_values: one input's "
                             "values in the model's per-example shape", value=None)
        problem = values_problem(req.baseline_values, shape) if shape is not None else None
        if problem is not None:
            at, why = problem
            raise FieldError(("body", "baseline_values", *at), f"baseline_values{''.join(f'[{j}]' for j in at)} "
                             f"{why}", value=None)
    elif req.baseline_values is not None:
        raise FieldError(("body", "baseline_values"), "baseline_values is the reference of baseline 'custom'; "
                         f"baseline is {base!r}", value=None)
    if spec is not None and base == "blur" and spec["input"].get("kind") != "image":
        raise FieldError(("body", "baseline"), f"baseline 'blur' is for images; model {req.model!r} takes "
                         f"{spec['input'].get('kind')} inputs", value=req.baseline)
    if base == "mean":
        for name in filter(None, (req.model, req.compare_with)):
            other = entry if name == req.model else registry.get_model(settings, name)
            other_spec = model_spec(other) if other is not None else None
            if other_spec is not None and other_spec["input"].get("mean") is None:
                raise FieldError(("body", "baseline"), f"baseline 'mean': model {name!r}'s spec has no training "
                                 "mean (spec.input.mean); choose zero, blur or custom", value=req.baseline)


def _check_samples(samples: list[SampleIn]) -> None:
    """Sample ids are unique, and each sample's history bodies (when given) match its history titles."""
    seen: set[str] = set()
    for i, s in enumerate(samples):
        if s.id in seen:
            raise FieldError(("body", "samples", i, "id"), f"duplicate sample id {s.id!r}", value=s.id)
        seen.add(s.id)
        if s.history_bodies is not None and len(s.history_bodies) != len(s.history):
            raise FieldError(("body", "samples", i, "history_bodies"), f"history_bodies has "
                             f"{len(s.history_bodies)} entries for {len(s.history)} history titles",
                             value=len(s.history_bodies))


def _labelled(settings: Settings, entry: dict[str, Any], dataset: DatasetIn) -> bool | None:
    """Whether the dataset's split has real/fake labels: from its recorded counts, else from a CSV header read in
    the bounded parser (:func:`core.dataset_formats.news_labelled`)."""
    counts = ((entry.get("meta") or {}).get("counts") or {}).get(dataset.split)
    if isinstance(counts, dict) and "labelled" in counts:
        return bool(counts["labelled"])
    return run_bounded(settings, "dataset.news_labelled", {"entry": entry, "split": dataset.split},
                       loc=("body", "dataset", "name"), value=dataset.name, shown=dataset.name)


def _check_dataset(dataset: DatasetIn, settings: Settings) -> None:
    """A registered news dataset, with real/fake labels in its split when a balanced draw is asked for."""
    entry = registry.get_dataset(settings, dataset.name)
    if entry is None or entry.get("kind") != DATASET_KIND:
        raise FieldError(("body", "dataset", "name"), f"unknown news dataset {dataset.name!r}",
                         value=dataset.name)
    if dataset.balanced and _labelled(settings, entry, dataset) is False:
        raise FieldError(("body", "dataset", "balanced"), f"dataset {dataset.name!r} has no real/fake "
                         f"labels in its {dataset.split} split (no labels.tsv or candidate_is_fake), so "
                         "it cannot be balanced", value=True)


def _check_batch_sizes(req: AttributionsRequest) -> None:
    for field in ("alpha_batch_size", "batch_size", "shard_size"):
        value = getattr(req, field)
        if value != "auto" and value < 1:
            raise FieldError(("body", field), f"{field} must be >= 1 or 'auto'", value=value)
    if req.alpha_batch_size != "auto" and req.batch_size != "auto" \
            and req.alpha_batch_size * req.batch_size > limits.MAX_IG_ROWS_PER_PASS:
        raise FieldError(("body", "batch_size"), f"alpha_batch_size {req.alpha_batch_size} x batch_size "
                         f"{req.batch_size} is more than {limits.MAX_IG_ROWS_PER_PASS:,} interpolated rows per pass; "
                         "lower one, or leave one 'auto' (sized from the model's measured memory)",
                         value=req.batch_size, related=[(("body", "alpha_batch_size"), req.alpha_batch_size)])


def _check_steps(req: AttributionsRequest) -> None:
    """Rules that evaluate both ends of the path need at least two steps."""
    method = req.method or default_method(req.tolerance)
    if method in NEEDS_TWO and req.n_steps < 2:
        why = "" if req.method else " (the default method with a tolerance)"
        raise FieldError(("body", "n_steps"), f"{method}{why} needs n_steps >= 2", value=req.n_steps)


def _check_faithfulness(req: AttributionsRequest) -> None:
    """Faithfulness ranks words by IG and compares that ranking with occlusion's: it needs an IG method."""
    if req.faithfulness and req.method == "occlusion":
        raise FieldError(("body", "faithfulness"), "faithfulness compares IG's word ranking with occlusion's and a "
                         "random one; method is occlusion: choose an IG method or leave faithfulness off",
                         value=True, related=[(("body", "method"), req.method)])


def validate(req: AttributionsRequest, settings: Settings, owner: str = "system") -> None:
    """Registry and cross-field checks; each raises a FieldError naming the field (422)."""
    entry = _check_models(req, settings)
    if entry["kind"] == HF_KIND:
        _check_hf_inputs(req, settings, entry)
    elif entry["kind"] == EXPORT_KIND:
        _check_export_inputs(req, settings, entry)
    else:
        _check_news_inputs(req, settings)
    _check_batch_sizes(req)
    _check_steps(req)
    _check_faithfulness(req)
    _check_shard_count(req, settings)


def _check_shard_count(req: AttributionsRequest, settings: Settings) -> None:
    """A fixed shard_size makes at most ``EXPLAINQ_MAX_SHARDS`` shards of the samples asked for."""
    if req.shard_size == "auto":
        return
    inline = next((getattr(req, f) for f in ("texts", "inputs", "samples") if getattr(req, f) is not None), None)
    n = len(inline) if inline is not None else req.dataset.n_samples if req.dataset is not None else 0
    problem = too_many_shards(n, req.shard_size, settings.max_shards, "samples")
    if problem is not None:
        raise FieldError(("body", "shard_size"), problem, value=req.shard_size)


register(JobKind(
    name="attributions",
    route="/attributions",
    request=AttributionsRequest,
    queue="explain",
    func="workers.jobs.attributions:run",
    # a dataset-scale request splits its samples (a shard carries its own slice of inline samples or texts)
    fanout=FanOut(unit="samples", shard="workers.jobs.attributions:run_shard",
                  reduce="workers.jobs.attributions:run_reduce", timeout_s=2 * 3600),
    timeout_s=2 * 3600,
    result_ttl_s=7 * 24 * 3600,
    summary=("Integrated Gradients of a news recommender's score over the words of a headline, of a Hugging Face "
             "classifier's class logit over the words of a text, or of an exported classifier's class logit over "
             "the pixels of an image or the features of a tabular row"),
    title="Attributions (Integrated Gradients)",
    renderer="attributions",
    pickers={"model": ("models", ("news", "hf_classifier", "exported_classifier")),
             "compare_with": ("models", ("news", "hf_classifier", "exported_classifier")),
             "dataset.name": ("datasets", "news")},
    widgets={"samples": "news_samples"},
    validate=validate,
))
