"""A job kind and the kind table: one place where a kind names its request, its result, its queue, its job
function and, when a large request is split over the workers, how it fans out.

The job function receives the request the API validated, as the kind's request model (``run(request, ctx)``);
the defaults live in that model only. It returns the kind's result model (``result``; by default the model of
its ``renderer``), whether it ran whole, from stored features or as shards.

``load_kinds(settings)`` builds the table the same way in the API and in the workers: every module of
``core.kinds``, then the ``EXPLAINQ_KIND_PLUGINS`` hooks (``module:function``, each called once per process).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field, model_validator

from core.contract import results
from core.contract.charts import chart_description
from core.contract.columns import job_columns
from core.contract.fields import RequestModel, with_label_and_tags
from core.keys import JOB_ID_PATTERN
from core.placement import QUEUES  # the kinds' queues (and the worker classes' own: core/placement.py)
from core.settings import Settings

# The result views clients know how to draw (a kind names one, or none for its result as JSON).
RENDERERS = tuple(results.BY_RENDERER)
# Form widgets beyond the ones a field's JSON schema implies.
FORM_WIDGETS = ("news_samples", "triples")


@dataclass(frozen=True)
class FanOut:
    """How a kind's request larger than one shard is split over the ``bulk`` workers (``workers/fanout.py`` plans
    it from this declaration): ``shard`` runs once per range of items and ``reduce`` once every shard has ended,
    both as internal kinds ``<kind>_shard`` and ``<kind>_reduce`` whose requests carry the parent's request typed
    (:class:`ShardRequest`, :class:`ReduceRequest`). ``from_parent`` names request fields too large to copy into
    every shard: shards and the reduce step read them from the parent job."""

    unit: str                 # what is split, in words: "candidates", "samples", "models"
    shard: str                # "module:function" of one shard
    reduce: str               # "module:function" of the reduce step
    timeout_s: int            # of each shard and of the reduce step
    from_parent: tuple[str, ...] = ()


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
    # the worker runs ``validate`` again before the job allocates anything: its memory estimates from the data and
    # configuration as they are then, against this worker's own budget (a dataset replaced by a larger one, a
    # budget smaller than the one admission compared with); a FieldError fails the job ``refused_on_worker``
    recheck: bool = False
    tags: tuple[str, ...] = field(default_factory=tuple)
    # run only by other jobs (the shards and reduce step of a fanned-out request): no HTTP route
    internal: bool = False
    # a request larger than one shard is split over the bulk workers (None: the kind never fans out)
    fanout: FanOut | None = None
    # the result the job function returns (a pydantic model); default: its renderer's model, else free JSON
    result: type[BaseModel] | None = None
    # --- how clients present the kind (the dashboard and the SDK read this; neither branches on kind names)
    title: str = ""  # display name; default: the name in words
    # the result view: one of RENDERERS, or None for the result as JSON
    renderer: str | None = None
    sdk_method: str | None = None  # the SDK's typed submit method; default: the kind's name
    # form fields that name registry entries: dotted field -> ("models" | "datasets", registry kind, or the
    # registry kinds it takes: ("news", "hf_classifier"))
    pickers: dict[str, tuple[str, str | tuple[str, ...]]] = field(default_factory=dict)
    # form fields with a widget of their own: dotted field -> widget name (see FORM_WIDGETS)
    widgets: dict[str, str] = field(default_factory=dict)
    # renderer "training": charts of the per-epoch rows, each {"id", "title", "series": [[row key, label], ...]},
    # or of the per-step curve with "rows": "steps" (charts.STEPS_CHART); nested values in a row are flattened
    # with "_" ({"valid": {"mrr": x}} is "valid_mrr"); colours come from charts.series_colours
    charts: tuple[dict[str, Any], ...] = ()
    # where live rows come from while the job runs: "history" (the metrics carry every epoch so far) or
    # "latest" (each progress event's metrics are one more row)
    live_rows: str = "latest"
    # the jobs list's model and input columns of a payload; default: job_columns (the fields kinds name alike)
    columns: Callable[[dict[str, Any]], dict[str, str]] | None = None
    # the size of a run (core/estimates.py): (request, settings, owner) -> TrainingSize | EvaluationSize | None
    estimate: Callable[[Any, Settings, str], Any] | None = None
    # the kind whose caller's runs measure the estimate's rate (None: this kind's own runs)
    estimate_rate_from: str | None = None

    def __post_init__(self) -> None:
        if not self.internal:  # every public kind's request has a label and tags
            object.__setattr__(self, "request", with_label_and_tags(self.request))
        if self.result is None and self.renderer is not None:
            object.__setattr__(self, "result", results.BY_RENDERER.get(self.renderer))
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
        if self.fanout is not None:
            for name in self.fanout.from_parent:
                if name not in self.request.model_fields:
                    raise ValueError(f"fanout.from_parent names {name!r}, not a field of {self.request.__name__}")

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
            # [section, registry kind], or [section, [registry kinds]] for a field that takes several
            "pickers": {k: [v[0], list(v[1]) if isinstance(v[1], tuple) else v[1]] for k, v in self.pickers.items()},
            "widgets": dict(self.widgets),
            "charts": [chart_description(c) for c in self.charts],
            "live_rows": self.live_rows,
            # the request field naming an earlier job of the same kind to continue, when the kind has one
            "resume_field": "resume_from" if "resume_from" in self.request.model_fields else None,
            # POST /kinds/{name}/estimate answers for this kind (a training run's size and time)
            "estimate": self.estimate is not None,
            # the name of the result's schema in the OpenAPI document (GET /jobs/{id}/result), when it has one
            "result": self.result.__name__ if self.result is not None else None,
        }

    def summary_of(self, payload: dict[str, Any]) -> dict[str, str]:
        """The jobs list's ``model`` and ``input`` of one of this kind's payloads."""
        return (self.columns or job_columns)(payload)


R = TypeVar("R", bound=BaseModel)


def _legacy_parent_fields(data: Any) -> Any:
    """A shard or reduce payload planned by earlier versions marked its request ``test_triples_from_parent``: the
    same as ``from_parent: ["test_triples"]`` now."""
    if isinstance(data, dict) and isinstance(data.get("request"), dict) \
            and data["request"].get("test_triples_from_parent"):
        request = {k: v for k, v in data["request"].items() if k != "test_triples_from_parent"}
        data = {**data, "request": request, "from_parent": ["test_triples"]}
    return data


class ShardRequest(RequestModel, Generic[R]):
    """One shard of a fanned-out request: items ``[start, end)`` of the parent's ``request``; the fields named in
    ``from_parent`` are read from the parent job before the shard runs."""

    parent: str = Field(..., pattern=JOB_ID_PATTERN)
    index: int = Field(..., ge=0)
    start: int = Field(..., ge=0)
    end: int = Field(..., ge=0)
    request: R
    from_parent: list[str] = Field(default_factory=list, max_length=8)

    _legacy = model_validator(mode="before")(_legacy_parent_fields)


class ReduceRequest(RequestModel, Generic[R]):
    """The step that merges a parent's ``shards`` shards (``from_parent`` as for a shard)."""

    parent: str = Field(..., pattern=JOB_ID_PATTERN)
    shards: int = Field(..., ge=1)
    request: R
    from_parent: list[str] = Field(default_factory=list, max_length=8)

    _legacy = model_validator(mode="before")(_legacy_parent_fields)


KINDS: dict[str, JobKind] = {}


def register(kind: JobKind) -> JobKind:
    """Register (or replace, for tests) a job kind, and with a ``fanout`` its shard and reduce kinds."""
    KINDS[kind.name] = kind
    if kind.fanout is not None:
        fan = kind.fanout
        KINDS[f"{kind.name}_shard"] = JobKind(
            name=f"{kind.name}_shard", route="", request=ShardRequest[kind.request], queue="bulk", func=fan.shard,
            timeout_s=fan.timeout_s, internal=True, summary=f"one shard of a fanned-out {kind.name} request")
        KINDS[f"{kind.name}_reduce"] = JobKind(
            name=f"{kind.name}_reduce", route="", request=ReduceRequest[kind.request], queue="bulk",
            func=fan.reduce, timeout_s=fan.timeout_s, internal=True, result=kind.result,
            summary=f"merges the shards of a fanned-out {kind.name} request")
    return kind


def unregister(name: str) -> None:
    kind = KINDS.pop(name, None)
    if kind is not None and kind.fanout is not None:
        KINDS.pop(f"{name}_shard", None)
        KINDS.pop(f"{name}_reduce", None)


def import_object(path: str) -> Any:
    """``"package.module:attribute"`` imported."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'module:attribute', got {path!r}")
    return getattr(importlib.import_module(module), attr)


PRODUCT_KINDS = "core.kinds"  # the package whose every module registers one of the product's kinds
_PRODUCT_LOADED = False
_PLUGINS_LOADED: set[str] = set()


def plugin_hooks(settings: Settings) -> list[str]:
    """The ``EXPLAINQ_KIND_PLUGINS`` hooks, in order."""
    return [h.strip() for h in settings.kind_plugins_raw.split(",") if h.strip()]


def load_kinds(settings: Settings | None = None) -> dict[str, JobKind]:
    """The kind table, the same in the API and the workers: every module of ``core.kinds`` (imported once), then
    each ``EXPLAINQ_KIND_PLUGINS`` hook of ``settings`` not called yet in this process. A hook is a
    ``module:function`` that registers its kinds with :func:`register`; its module, like ``core.kinds``, must not
    import torch or FastAPI (the API imports it)."""
    global _PRODUCT_LOADED
    if not _PRODUCT_LOADED:  # found by name: the kinds build on this module, not the other way round
        spec = importlib.util.find_spec(PRODUCT_KINDS)
        for info in pkgutil.iter_modules(spec.submodule_search_locations if spec else []):
            importlib.import_module(f"{PRODUCT_KINDS}.{info.name}")
        _PRODUCT_LOADED = True
    if settings is not None:
        for hook in plugin_hooks(settings):
            if hook not in _PLUGINS_LOADED:
                import_object(hook)()
                _PLUGINS_LOADED.add(hook)
    return KINDS


def kind_of(name: str) -> JobKind | None:
    return KINDS.get(name)
