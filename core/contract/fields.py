"""The fields every request is built of: the strict base model, the job's label and tags, validators for
free-form JSON, and the fan-out fields of a request that can be split over the workers."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, StringConstraints, create_model

from core import limits


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
# A worker class's name (EXPLAINQ_WORKER_CLASSES, core/placement.py): also a part of its queues' names.
CLASS_PATTERN = r"^[a-z0-9][a-z0-9-]{0,31}$"


class Requirements(RequestModel):
    """What a job needs of the worker that runs it (core/placement.py): it goes only to a worker class that offers
    all of it; a job that states none goes to any worker of its queue that can hold it."""

    gpu: bool | None = Field(None, title="Needs a GPU", description="true: only a worker with a GPU; false: only "
                             "one without")
    gpu_memory_gib: float | None = Field(None, gt=0, le=4096, title="GPU memory (GiB)",
                                         description="At least this much memory on the worker's GPU")
    device_class: str | None = Field(None, max_length=32, pattern=CLASS_PATTERN, title="Worker class",
                                     description="Only workers of this class (a name of EXPLAINQ_WORKER_CLASSES)")


REQUIREMENTS_FIELD = dict(title="What the job needs of its worker", json_schema_extra={"advanced": True},
                          description="What the job needs of its worker (a GPU, its memory, a worker class); "
                          "leave out to run on any worker of the job's queue")


class JobRequest(RequestModel):
    """The base of every kind's request: what every job carries besides its parameters, a ``label`` and
    ``tags`` of the caller's, stored with the job and searchable (``GET /jobs?q=&tag=``)."""

    label: Label | None = Field(None, **LABEL_FIELD)
    tags: Tags = Field(default_factory=list, **TAGS_FIELD)
    requirements: Requirements | None = Field(None, **REQUIREMENTS_FIELD)


def with_label_and_tags(request: type[BaseModel]) -> type[BaseModel]:
    """``request`` itself when it has ``label`` and ``tags`` (every kind's request derives from
    :class:`JobRequest`), else a subclass that adds them, so a kind registered with another base has them too."""
    fields = request.model_fields
    if "label" in fields and "tags" in fields and "requirements" in fields:
        return request
    extra: dict[str, Any] = {}
    if "label" not in fields:
        extra["label"] = (Label | None, Field(None, **LABEL_FIELD))
    if "tags" not in fields:
        extra["tags"] = (Tags, Field(default_factory=list, **TAGS_FIELD))
    if "requirements" not in fields:
        extra["requirements"] = (Requirements | None, Field(None, **REQUIREMENTS_FIELD))
    extended = create_model(request.__name__, __base__=request, __module__=request.__module__, **extra)
    extended.__doc__ = request.__doc__
    return extended


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


