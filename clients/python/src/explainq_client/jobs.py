"""The data types of the API (a job's view, a page of jobs, artifacts, models) and the job logic that does no
I/O, shared by :class:`explainq_client.Job` and :class:`explainq_client.AsyncJob`."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from explainq_client import render
from explainq_client._http import TERMINAL, JobEvent, SSEParser
from explainq_client.errors import ExplainqError, JobCanceledError, JobFailedError, WaitTimeoutError
from explainq_client.results import Result, make_result

__all__ = ["Artifact", "DatasetInfo", "JobBase", "JobPage", "ModelInfo", "ModelList", "parse_entry"]

RESULT_SCHEMA_HEADER = "x-explainq-result-schema"  # the result model a result validated against, or "unvalidated"


def parse_entry(line: str) -> Any:
    """One entry of a listed JSONL artifact (None for a blank line)."""
    line = line.strip()
    return json.loads(line) if line else None


@dataclass(frozen=True)
class Artifact:
    """A file a job wrote: ``name`` is relative (may contain ``/``); ``url`` is the API path to download it."""

    name: str
    size: int | None
    media_type: str | None
    url: str

    @classmethod
    def from_json(cls, job_id: str, data: dict[str, Any]) -> Artifact:
        name = str(data["name"])
        url = data.get("url") or f"/jobs/{quote(job_id)}/artifacts/{quote(name)}"
        return cls(name, data.get("size"), data.get("media_type"), url)


@dataclass(frozen=True)
class ModelInfo:
    """A model of ``GET /models``: where it is loaded, who owns it; ``status`` is ``ready`` once registered,
    ``preparing`` while the demo preparation has yet to register it (a request naming it is retried after its
    ``Retry-After``)."""

    name: str
    kind: str | None
    parameters: int | None = None
    created_at: str | None = None
    owner: str | None = None
    devices: list[str] = field(default_factory=list)
    loaded_on: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    status: str = "ready"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelInfo:
        return cls(str(data["name"]), data.get("kind"), data.get("parameters"), data.get("created_at"),
                   data.get("owner"), list(data.get("devices") or []), list(data.get("loaded_on") or []),
                   dict(data.get("meta") or {}), str(data.get("status") or "ready"))


@dataclass(frozen=True)
class DatasetInfo:
    """A registered dataset."""

    name: str
    kind: str | None
    owner: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DatasetInfo:
        return cls(str(data["name"]), data.get("kind"), data.get("owner"), dict(data.get("meta") or {}))


@dataclass(frozen=True)
class ModelList:
    """``GET /models``: the registered models and datasets."""

    models: list[ModelInfo]
    datasets: list[DatasetInfo]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelList:
        return cls([ModelInfo.from_json(m) for m in data.get("models") or []],
                   [DatasetInfo.from_json(d) for d in data.get("datasets") or []])

    def names(self) -> list[str]:
        return [m.name for m in self.models]


J = TypeVar("J", bound="JobBase")


def dataset_body(name: str, path: str, description: str | None, overwrite: bool) -> dict[str, Any]:
    """The ``POST /datasets`` body (a description left out stays unset)."""
    body: dict[str, Any] = {"name": name, "path": path, "overwrite": overwrite}
    if description is not None:
        body["description"] = description
    return body


@dataclass
class JobPage(Generic[J]):
    """One page of ``GET /jobs``, newest first; pass ``next_cursor`` as ``cursor`` for the next page."""

    items: list[J]
    next_cursor: str | None

    @classmethod
    def from_json(cls, body: dict[str, Any], make: Callable[[dict[str, Any]], J]) -> JobPage[J]:
        return cls([make(view) for view in body.get("items") or []], body.get("next_cursor"))

    def __iter__(self) -> Iterator[J]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


CANCEL_ONLY = {"cancel_only": "true"}  # a cancel never deletes a job that finished meanwhile


def list_params(kind: str | None, status: str | None, limit: int | None, cursor: str | None,
                q: str | None = None, tag: str | Sequence[str] | None = None,
                model_digest: str | None = None) -> dict[str, Any]:
    """The query of ``GET /jobs`` (unset filters left out); ``tag`` is one tag or several (jobs with all)."""
    given = {"kind": kind, "status": status, "limit": limit, "cursor": cursor, "q": q,
             "tag": [tag] if isinstance(tag, str) else (list(tag) if tag else None), "model_digest": model_digest}
    return {k: v for k, v in given.items() if v is not None}


class JobBase:
    """A job as last seen: its view (``GET /jobs/{id}``) and, once fetched, its result."""

    def __init__(self, view: dict[str, Any]):
        self._view: dict[str, Any] = dict(view)
        self._result: Result | None = None

    # ---- the view
    @property
    def data(self) -> dict[str, Any]:
        """The job view as the server last sent it."""
        return self._view

    @property
    def id(self) -> str:
        """The job id."""
        return str(self._view["id"])

    @property
    def kind(self) -> str | None:
        """The job kind, e.g. ``attributions``."""
        return self._view.get("kind")

    @property
    def label(self) -> str | None:
        """The label given at submission, if any."""
        return self._view.get("label")

    @property
    def tags(self) -> list[str]:
        """The tags given at submission (lower case)."""
        return list(self._view.get("tags") or [])

    @property
    def model(self) -> str | None:
        """The model the job reads (or ``→ name``, the one it registers), as the jobs list shows it."""
        return self._view.get("model")

    @property
    def input(self) -> str | None:
        """A short summary of the job's input (samples, triples, dataset), as the jobs list shows it."""
        return self._view.get("input")

    @property
    def status(self) -> str | None:
        """``queued``, ``running``, ``succeeded``, ``failed`` or ``canceled``."""
        return self._view.get("status")

    @property
    def queue(self) -> str | None:
        """``explain`` or ``train``."""
        return self._view.get("queue")

    @property
    def progress(self) -> dict[str, Any] | None:
        """``{done, total, unit, message, eta_s}``, or None before the first report."""
        return self._view.get("progress")

    @property
    def metrics(self) -> dict[str, Any] | None:
        """The latest metrics a training job reported (``history`` included)."""
        return self._view.get("metrics")

    @property
    def error(self) -> dict[str, str] | None:
        """``{code, message}`` when the job failed or was canceled."""
        return self._view.get("error")

    @property
    def position(self) -> int | None:
        """The place in its queue while queued (0: next), when the server reports it."""
        return self._view.get("position")

    @property
    def kept(self) -> bool:
        """Whether the job is kept (``job.keep()``): exempt from the server's retention until the keep is undone."""
        return bool(self._view.get("kept"))

    @property
    def waiting_reason(self) -> str | None:
        """Why a queued job does not start (no live worker on its queue yet), when the server says; else None."""
        return self._view.get("waiting_reason")

    @property
    def created_at(self) -> str | None:
        """ISO 8601, UTC."""
        return self._view.get("created_at")

    @property
    def started_at(self) -> str | None:
        """ISO 8601, UTC."""
        return self._view.get("started_at")

    @property
    def finished_at(self) -> str | None:
        """ISO 8601, UTC."""
        return self._view.get("finished_at")

    @property
    def done(self) -> bool:
        """The job has ended (succeeded, failed or canceled)."""
        return self.status in TERMINAL

    @property
    def path(self) -> str:
        return f"/jobs/{quote(self.id)}"

    def _update(self, view: dict[str, Any]) -> None:
        if view.get("id") == self.id:
            self._view = dict(view)

    def _check_outcome(self) -> None:
        """Raise the typed error of a failed or canceled job."""
        error = self.error or {}
        if self.status == "failed":
            raise JobFailedError(self, str(error.get("code", "failed")), str(error.get("message", "")))
        if self.status == "canceled":
            raise JobCanceledError(self, str(error.get("code", "canceled")), str(error.get("message", "")))

    def _keep_result(self, data: Any, renderer: str | None, schema: str | None = None) -> Result:
        """The result as its renderer's class; ``schema``: the response's ``X-Explainq-Result-Schema``
        (``unvalidated``: a plain :class:`Result` shown as JSON)."""
        self._result = make_result(renderer, data, self.kind, schema)
        return self._result

    def _listed_source(self, result: Result, name: str) -> tuple[str | None, list[Any]]:
        """Where every entry of the list ``name`` is: the JSONL artifact ``listed[name]`` names (None when the
        result holds the list whole), and the entries the result holds inline."""
        inline = render._lookup(result, name)
        entry = (result.get("listed") or {}).get(name)
        if isinstance(entry, dict):
            if entry.get("artifact"):
                return str(entry["artifact"]), []
            if int(entry.get("total") or 0) > len(inline or []):
                raise ExplainqError(f"job {self.id}: the result holds {len(inline or [])} of the "
                                    f"{entry.get('total')} entries of {name!r} and names no artifact with them all")
        if not isinstance(inline, list):
            lists = sorted([*(result.get("listed") or {}),
                            *(k for k, v in result.items() if isinstance(v, list) and k not in ("artifacts",))])
            raise ExplainqError(f"job {self.id}: its result has no list {name!r}; it has {lists}")
        return None, inline

    def _artifact_path(self, name: str) -> str:
        return f"{self.path}/artifacts/{quote(name)}"

    def _on_line(self, parser: SSEParser, line: str) -> JobEvent | None:
        """Feed one line of the event stream; a status event also updates this job's view."""
        event = parser.feed(line)
        if event is not None and event.job is not None:
            self._update(event.job)
        return event

    def _select(self, items: list[Artifact], names: Iterable[str] | None) -> list[Artifact]:
        if names is None:
            return items
        wanted = list(names)
        known = {a.name: a for a in items}
        missing = [n for n in wanted if n not in known]
        if missing:
            raise ExplainqError(f"job {self.id} has no artifact(s) {missing}; it has {sorted(known)}")
        return [known[n] for n in wanted]

    def _artifacts_from(self, body: dict[str, Any]) -> list[Artifact]:
        return [Artifact.from_json(self.id, item) for item in body.get("items") or []]

    # ---- display
    def __repr__(self) -> str:
        progress = self.progress or {}
        where = f" {progress.get('done')}/{progress.get('total')} {progress.get('unit')}" if progress else ""
        return f"<{type(self).__name__} {self.id} {self.kind} {self.status}{where}>"

    def _repr_html_(self) -> str:
        result_html = getattr(self._result, "_repr_html_", None)
        if result_html is None:
            return render.job_html(self._view)
        return render.job_html(self._view, curves=False) + result_html()


def in_notebook() -> bool:
    """Running in a Jupyter kernel (IPython's ZMQ shell), looked up without importing IPython."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


class ProgressBar:
    """What ``wait(progress=...)`` shows: a ``tqdm.auto`` bar (a widget in a notebook, text on a terminal) of the
    job's ``progress`` (done of total, its unit and message), redrawn at each poll from the first report on, a new
    bar when the unit changes (another phase), closed when the job ends.
    ``enabled`` None: on in a notebook where tqdm is installed, off elsewhere; True: on (tqdm must be installed:
    ``pip install tqdm``); False: off."""

    def __init__(self, job: JobBase, enabled: bool | None):
        self.job = job
        self.bar: Any = None
        self._tqdm: Any = None
        if enabled is False or (enabled is None and not in_notebook()):
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            if enabled:
                raise ImportError("wait(progress=True) draws its bar with tqdm: pip install tqdm") from None
            return
        self._tqdm = tqdm

    def update(self) -> None:
        """Redraw from the job's current view."""
        p = self.job.progress
        if self._tqdm is None or not isinstance(p, dict):  # nothing drawn before the job's first report
            return
        done, total, unit = p.get("done"), p.get("total"), str(p.get("unit") or "it")
        total = total if isinstance(total, int | float) and total > 0 else None
        if self.bar is not None and self.bar.unit != unit:  # another phase (batches, then estimators)
            self.bar.close()
            self.bar = None
        if self.bar is None:
            self.bar = self._tqdm(total=total, unit=unit, desc=f"{self.job.kind or 'job'} {str(self.job.id)[:8]}")
        self.bar.total = total
        if isinstance(done, int | float):
            self.bar.n = done
        postfix = self.job.status if p.get("message") is None else f"{self.job.status}: {p['message']}"
        self.bar.set_postfix_str(str(postfix), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class WaitClock:
    """The polling schedule of ``wait()``: quick at first, then every ``poll_interval``; raises
    :class:`WaitTimeoutError` when ``timeout`` has passed."""

    def __init__(self, job: JobBase, timeout: float | None, poll_interval: float):
        self.job = job
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.poll_interval = max(poll_interval, 0.01)
        self.delay = min(0.1, self.poll_interval)

    def next_sleep(self) -> float:
        delay = self.delay
        self.delay = min(self.delay * 2, self.poll_interval)
        if self.deadline is None:
            return delay
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeoutError(self.job, self.timeout or 0.0)
        return min(delay, remaining)
