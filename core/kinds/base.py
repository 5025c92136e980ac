"""The job-kind registry: one place where a kind names its request schema, queue and job function."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, StringConstraints, create_model

from core import limits
from core.keys import JOB_ID_PATTERN
from core.settings import Settings

# Workers list their queues in priority order: "explain,bulk" serves an interactive request before the next shard
# of a dataset-scale run; "train" runs long training jobs on workers of its own.
QUEUES = ("explain", "bulk", "train")
# The result views clients know how to draw (a kind names one, or none for its result as JSON).
RENDERERS = ("attributions", "influence", "training", "ablation", "evaluation")
# Form widgets beyond the ones a field's JSON schema implies.
FORM_WIDGETS = ("news_samples", "triples")

# Curve colours, one definition for every client (the dashboard reads them from GET /kinds; the SDK's
# ``explainq_client.render.series_colours`` is the same rule, tested equal): the Okabe-Ito palette, colour-blind
# safe. In a chart, the first training series (a key starting with "train", or the bare "loss") is TRAIN_COLOUR,
# the first validation series (a key starting with "val") VALIDATION_COLOUR, every other series the next of
# OTHER_COLOURS in order.
TRAIN_COLOUR = "#0072B2"       # blue
VALIDATION_COLOUR = "#D55E00"  # vermillion
OTHER_COLOURS = ("#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")


def series_split(key: str) -> str | None:
    """``"train"``, ``"validation"`` or None for a chart series' row key (flattened: ``valid_mrr``)."""
    k = key.lower()
    if k.startswith("train") or k == "loss":
        return "train"
    if k.startswith("val"):
        return "validation"
    return None


def series_colours(keys: Sequence[str]) -> list[str]:
    """The colour of each series of one chart, in order (see TRAIN_COLOUR)."""
    out, taken, other = [], set(), 0
    for key in keys:
        split = series_split(key)
        if split is not None and split not in taken:
            taken.add(split)
            out.append(TRAIN_COLOUR if split == "train" else VALIDATION_COLOUR)
        else:
            out.append(OTHER_COLOURS[other % len(OTHER_COLOURS)])
            other += 1
    return out


def chart_description(chart: dict[str, Any]) -> dict[str, Any]:
    """A chart spec as clients get it: ``rows`` (``"history"``: one row per epoch; ``"steps"``: the per-step
    running-loss curve, x the fractional epoch) and each series as ``[row key, label, colour]``."""
    series = [list(s[:2]) for s in chart.get("series", [])]
    colours = series_colours([s[0] for s in series])
    return {**chart, "rows": chart.get("rows", "history"),
            "series": [[key, label, colour] for (key, label), colour in zip(series, colours, strict=True)]}


# The per-step running-loss chart every training kind shows first (models.curves: bounded, live from the first
# steps).
STEPS_CHART: dict[str, Any] = {"id": "steps", "title": "Running loss by step", "rows": "steps",
                               "series": [["loss", "train loss (running mean)"]]}


class RequestModel(BaseModel):
    """The base of every request model and of every model nested in one.

    A field the schema does not name is an error (a typo is never silently ignored), and so are NaN and the
    infinities in float fields: ``ge=0`` lets ``Infinity`` through, and no job can use one. (JSON has no such
    numbers, but Python's parser reads ``NaN``, ``Infinity`` and ``1e999``.)
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# A tag: a short slug, compared without case (stored in lower case).
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# A label: one line of free text (no control characters: it is shown in a table row and in page titles).
LABEL_PATTERN = r"^[^\x00-\x1f\x7f]*$"


def _unique_lower(tags: list[str]) -> list[str]:
    return list(dict.fromkeys(t.lower() for t in tags))


Tag = Annotated[StrictStr, StringConstraints(min_length=1, max_length=limits.MAX_TAG_LENGTH, pattern=TAG_PATTERN)]
Label = Annotated[StrictStr, StringConstraints(strip_whitespace=True, max_length=limits.MAX_LABEL_LENGTH,
                                               pattern=LABEL_PATTERN)]
Tags = Annotated[list[Tag], Field(max_length=limits.MAX_TAGS), AfterValidator(_unique_lower)]

LABEL_FIELD = dict(title="Job label", description="A name of your own for this job, shown in the jobs list and "
                   "found by its search")
TAGS_FIELD = dict(title="Job tags", description="Short words to group and find jobs by (letters, digits, '-', '_', "
                  "'.'; compared without case)")


class JobRequest(RequestModel):
    """The base of every kind's request: what every job carries besides its parameters, a ``label`` and
    ``tags`` of the caller's, stored with the job and searchable (``GET /jobs?q=&tag=``)."""

    label: Label | None = Field(None, **LABEL_FIELD)
    tags: Tags = Field(default_factory=list, **TAGS_FIELD)


def with_label_and_tags(request: type[BaseModel]) -> type[BaseModel]:
    """``request`` itself when it has ``label`` and ``tags`` (every kind's request derives from
    :class:`JobRequest`), else a subclass that adds them, so a kind registered with another base has them too."""
    fields = request.model_fields
    if "label" in fields and "tags" in fields:
        return request
    extended = create_model(request.__name__, __base__=request, __module__=request.__module__,
                            label=(Label | None, Field(None, **LABEL_FIELD)),
                            tags=(Tags, Field(default_factory=list, **TAGS_FIELD)))
    extended.__doc__ = request.__doc__
    return extended


# ---- what the jobs list shows of a request: the model and a short summary of the input
INPUT_SUMMARY_LENGTH = 120


def _clip(text: str, n: int = INPUT_SUMMARY_LENGTH) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def job_columns(payload: dict[str, Any]) -> dict[str, str]:
    """The jobs list's ``model`` and ``input`` of a request (``{}`` entries left out), from the fields every kind
    names alike: the model a job reads (``model``) or the one it registers (``name``, ``register_as``); the
    samples, triples, dataset or path it reads. Bounded to ``INPUT_SUMMARY_LENGTH`` characters each."""
    out: dict[str, str] = {}
    model = payload.get("model")
    if isinstance(model, str):
        out["model"] = model
        if isinstance(payload.get("compare_with"), str):
            out["model"] += f" vs {payload['compare_with']}"
    else:
        name = payload.get("name") if isinstance(payload.get("name"), str) else payload.get("register_as")
        if isinstance(name, str):
            out["model"] = f"→ {name}"
    parts: list[str] = []
    samples = payload.get("samples")
    if isinstance(samples, list) and samples:
        first = samples[0].get("candidate") if isinstance(samples[0], dict) else None
        parts.append(_plural(len(samples), "sample") + (f": “{first}”" if first else ""))
    triples = payload.get("test_triples")
    if isinstance(triples, list) and triples:
        first = triples[0] if isinstance(triples[0], list) else []
        parts.append(_plural(len(triples), "triple") + (": " + " · ".join(map(str, first)) if first else ""))
    dataset = payload.get("dataset")
    if isinstance(dataset, dict) and isinstance(dataset.get("name"), str):
        parts.append(f"{dataset['name']} ({dataset.get('split', 'test')}, {dataset.get('n_samples', '?')})")
    elif isinstance(dataset, str):
        parts.append(dataset)
    for key in ("test_triples_path", "path"):
        if isinstance(payload.get(key), str):
            parts.append(payload[key])
    if not parts and payload.get("mode") == "self":
        parts.append("self-influence")
    if parts:
        out["input"] = "; ".join(parts)
    return {k: _clip(v) for k, v in out.items()}


def _not_unicode(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def refuse_invalid_text(value: Any) -> Any:
    """A field validator for free-form JSON (``dict[str, Any]``; pydantic refuses them in ``str`` fields itself):
    ``value`` unchanged, or a ValueError when a string in it (or a key) is not Unicode text. JSON's ``\\ud800``
    escape decodes to a lone surrogate, which no file system, Redis client or UTF-8 response can encode."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _not_unicode(item):
                raise ValueError("must be Unicode text: it holds a lone surrogate (an unpaired \\ud800-\\udfff "
                                 "escape)")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return value


def refuse_non_finite(value: Any) -> Any:
    """A field validator for free-form JSON (``dict[str, Any]``, which ``allow_inf_nan`` does not reach): ``value``
    unchanged, or a ValueError naming the first non-finite number's place in it."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{where.lstrip('.') or 'the value'} must be a finite number, not {item}")
        if isinstance(item, dict):
            stack.extend((f"{where}.{k}", v) for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(item))
    return value


class FieldError(ValueError):
    """A request field that is well-formed but wrong for this server (unknown model, path outside roots...).

    Rendered as a 422 in FastAPI's error shape, with ``loc`` naming the field. ``related`` names other fields the
    same problem involves, as ``(loc, value)`` pairs (a size that is the product of two fields): each gets an entry
    with the same message.
    """

    def __init__(self, loc: tuple[str | int, ...] | list[str | int], message: str, value: Any = None,
                 related: Sequence[tuple[tuple[str | int, ...], Any]] = ()):
        super().__init__(message)
        self.loc = tuple(loc)
        self.message = message
        self.value = value
        self.related = [(tuple(rloc), rvalue) for rloc, rvalue in related]

    status_code = 422
    code = "invalid"

    def detail(self) -> dict[str, Any]:
        return {"loc": list(self.loc), "msg": self.message, "type": "value_error", "input": self.value}

    def body(self) -> dict[str, Any]:
        """The response body: FastAPI's validation shape for 422, ``{"detail": {code, message, loc}}`` otherwise."""
        if self.status_code == 422:
            return {"detail": [self.detail()] + [{**self.detail(), "loc": list(rloc), "input": rvalue}
                                                 for rloc, rvalue in self.related]}
        return {"detail": {"code": self.code, "message": self.message, "loc": list(self.loc)}}


class FieldNotFound(FieldError):
    """A field naming something the caller may not see: another owner's job answers exactly as a missing one."""

    status_code = 404
    code = "not_found"


class FieldConflict(FieldError):
    """A field naming something that exists but belongs to another owner (a model name, say)."""

    status_code = 409
    code = "owned_by_other"


class FieldUnavailable(FieldError):
    """A field naming something that is being prepared (a demo model not registered yet): 503 with
    ``Retry-After``, the seconds until it should be ready."""

    status_code = 503
    code = "preparing"

    def __init__(self, loc: tuple[str | int, ...] | list[str | int], message: str, value: Any = None,
                 retry_after_s: int = 30):
        super().__init__(loc, message, value=value)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class JobKind:
    name: str
    route: str
    request: type[BaseModel]
    queue: str
    func: str
    timeout_s: int = 3600
    result_ttl_s: int | None = None
    summary: str = ""
    # validate(request, settings, owner): registry and cross-field checks at submission; raises FieldError
    validate: Callable[[Any, Settings, str], None] | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)
    # run only by other jobs (the shards and reduce step of a fanned-out request): no HTTP route
    internal: bool = False
    # --- how clients present the kind (the dashboard and the SDK read this; neither branches on kind names)
    title: str = ""  # display name; default: the name in words
    # the result view: one of RENDERERS, or None for the result as JSON
    renderer: str | None = None
    sdk_method: str | None = None  # the SDK's typed submit method; default: the kind's name
    # form fields that name registry entries: dotted field -> ("models" | "datasets", registry kind)
    pickers: dict[str, tuple[str, str]] = field(default_factory=dict)
    # form fields with a widget of their own: dotted field -> widget name (see FORM_WIDGETS)
    widgets: dict[str, str] = field(default_factory=dict)
    # renderer "training": charts of the per-epoch rows, each {"id", "title", "series": [[row key, label], ...]},
    # or of the per-step curve with "rows": "steps" (STEPS_CHART); nested values in a row are flattened with "_"
    # ({"valid": {"mrr": x}} is "valid_mrr"); colours come from series_colours
    charts: tuple[dict[str, Any], ...] = ()
    # where live rows come from while the job runs: "history" (the metrics carry every epoch so far) or
    # "latest" (each progress event's metrics are one more row)
    live_rows: str = "latest"
    # the jobs list's model and input columns of a payload; default: job_columns (the fields kinds name alike)
    columns: Callable[[dict[str, Any]], dict[str, str]] | None = None
    # a training kind's size of a run (core/estimates.py): (request, settings) -> TrainingSize | None
    estimate: Callable[[Any, Settings], Any] | None = None

    def __post_init__(self) -> None:
        if not self.internal:  # every public kind's request has a label and tags
            object.__setattr__(self, "request", with_label_and_tags(self.request))
        if self.queue not in QUEUES:
            raise ValueError(f"queue must be one of {QUEUES}, got {self.queue!r}")
        if ":" not in self.func:
            raise ValueError("func must be 'module.path:function'")
        if not self.internal and not self.route.startswith("/"):
            raise ValueError("route must start with '/'")
        if self.renderer is not None and self.renderer not in RENDERERS:
            raise ValueError(f"renderer must be one of {RENDERERS} or None, got {self.renderer!r}")
        if self.live_rows not in ("history", "latest"):
            raise ValueError("live_rows must be 'history' or 'latest'")
        if any(w not in FORM_WIDGETS for w in self.widgets.values()):
            raise ValueError(f"widgets must be among {FORM_WIDGETS}")

    def describe(self) -> dict[str, Any]:
        """What a client needs to present the kind: ``GET /kinds`` and the submit route's ``x-explainq-kind``."""
        return {
            "name": self.name,
            "route": self.route,
            "queue": self.queue,
            "title": self.title or self.name.replace("_", " ").capitalize(),
            "summary": self.summary,
            "renderer": self.renderer,
            "sdk_method": self.sdk_method or self.name,
            "pickers": {k: list(v) for k, v in self.pickers.items()},
            "widgets": dict(self.widgets),
            "charts": [chart_description(c) for c in self.charts],
            "live_rows": self.live_rows,
            # the request field naming an earlier job of the same kind to continue, when the kind has one
            "resume_field": "resume_from" if "resume_from" in self.request.model_fields else None,
            # POST /kinds/{name}/estimate answers for this kind (a training run's size and time)
            "estimate": self.estimate is not None,
        }


    def summary_of(self, payload: dict[str, Any]) -> dict[str, str]:
        """The jobs list's ``model`` and ``input`` of one of this kind's payloads."""
        return (self.columns or job_columns)(payload)


KINDS: dict[str, JobKind] = {}



class ShardRequest(RequestModel):
    """One shard of a fanned-out request: items ``[start, end)`` of the parent's ``request``."""
    parent: str = Field(..., pattern=JOB_ID_PATTERN)
    index: int = Field(..., ge=0)
    start: int = Field(..., ge=0)
    end: int = Field(..., ge=0)
    request: dict[str, Any]


class ReduceRequest(RequestModel):
    """The step that merges a parent's ``shards`` shards."""
    parent: str = Field(..., pattern=JOB_ID_PATTERN)
    shards: int = Field(..., ge=1)
    request: dict[str, Any]


# ``shard_size``: items per shard, or "auto" (validate refuses a size below 1 with its own message)
ShardSize = Annotated[int, Field(le=limits.MAX_SHARD_SIZE)] | Literal["auto"]


ADVANCED = {"advanced": True}  # json_schema_extra of a field forms fold under "Advanced"


def shard_size_field(unit: str) -> Any:
    """``shard_size`` of a request that can fan out: ``unit`` per shard, or ``"auto"``."""
    return Field("auto", title="Items per shard", json_schema_extra=ADVANCED,
                 description=f"{unit[0].upper()}{unit[1:]} per shard when a large request is split over the "
                 "workers: 'auto' sizes shards from the model's measured speed (about two minutes each); a "
                 "request of at most one shard runs as one job")


def max_failed_field(unit: str) -> Any:
    return Field(0.01, ge=0, le=1, title="Tolerated failure share", json_schema_extra=ADVANCED,
                 description=f"A split run fails when more {unit} than this share fail; otherwise it succeeds "
                 "and lists them")


def shard_retries_field() -> Any:
    return Field(1, ge=0, le=limits.MAX_SHARD_RETRIES, title="Retries per shard", json_schema_extra=ADVANCED,
                 description="How many times a failed shard is tried again")


def register_fanout(kind: str, module: str, timeout_s: int) -> None:
    """Register ``<kind>_shard`` and ``<kind>_reduce`` (functions ``run_shard`` / ``run_reduce`` of ``module``)."""
    register(JobKind(name=f"{kind}_shard", route="", request=ShardRequest, queue="bulk",
                     func=f"{module}:run_shard", timeout_s=timeout_s, internal=True,
                     summary=f"one shard of a fanned-out {kind} request"))
    register(JobKind(name=f"{kind}_reduce", route="", request=ReduceRequest, queue="bulk",
                     func=f"{module}:run_reduce", timeout_s=timeout_s, internal=True,
                     summary=f"merges the shards of a fanned-out {kind} request"))


def register(kind: JobKind) -> JobKind:
    """Register (or replace, for tests) a job kind."""
    KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    KINDS.pop(name, None)


def require_name_free(settings: Settings, name: str, owner: str, field: str, section: str = "models") -> None:
    """409 on ``field`` when ``name`` is registered to another owner (only its owner may replace it)."""
    from core import registry

    try:
        registry.check_owner(settings, section, name, owner)
    except registry.OwnershipError as exc:
        raise FieldConflict(("body", field), str(exc), value=name) from None


def require_new_name(settings: Settings, name: str, owner: str, kind: str, overwrite: bool,
                     field: str = "name") -> None:
    """The model name a job will register: 409 when another owner holds it; 422 when the caller's model of that
    name exists and ``overwrite`` is false, or is of another kind."""
    from core import registry

    require_name_free(settings, name, owner, field)
    existing = registry.get_model(settings, name)
    if existing is not None and not overwrite:
        raise FieldError(("body", field), f"a model named {name!r} exists; pass overwrite=true to replace it",
                         value=name)
    if existing is not None and existing.get("kind") != kind:
        raise FieldError(("body", field), f"{name!r} is a {existing.get('kind')!r} model; overwrite replaces "
                         f"{kind} models only", value=name)


def refuse_if_preparing(settings: Settings, section: str, name: str, loc: tuple[str | int, ...]) -> None:
    """A ``FieldUnavailable`` (503, ``Retry-After``) when the live demo preparation has yet to register ``name`` in
    ``section`` (``models`` or ``datasets``); nothing otherwise (core/demo_status.py)."""
    from core import demo_status, registry

    coming = demo_status.preparing(registry.connection(settings), section, name)
    if coming is not None:
        field = ".".join(str(p) for p in loc[1:])
        raise FieldUnavailable(loc, f"{field}: {section[:-1]} {name!r} is being prepared (demo step "
                               f"{coming['step']!r}, {coming['state']}); retry in about {coming['retry_after_s']} s",
                               value=name, retry_after_s=coming["retry_after_s"])


def require_model(settings: Settings, name: str, kind: str, field: str = "model",
                  kind_label: str | None = None) -> dict[str, Any]:
    """The registry entry of model ``name``, which must be of ``kind``; a FieldError on ``field`` otherwise."""
    from core import registry

    entry = registry.get_model(settings, name)
    if entry is None:
        refuse_if_preparing(settings, "models", name, ("body", field))
        raise FieldError(("body", field), f"unknown model {name!r}", value=name)
    if entry.get("kind") != kind:
        raise FieldError(("body", field), f"model {name!r} is a {entry.get('kind')!r} model, not "
                         f"{kind_label or kind}", value=name)
    return entry
