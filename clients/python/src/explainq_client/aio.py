"""The asynchronous client: :class:`AsyncClient` and :class:`AsyncJob`, the same surface as the sync client
with ``await`` (and ``async for`` over :meth:`AsyncJob.stream` and :meth:`AsyncJobs.iter`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from explainq_client._http import (
    NO_RETRY,
    ClientConfig,
    JobEvent,
    RetryPolicy,
    RetryState,
    SSEParser,
    artifact_target,
    new_idempotency_key,
)
from explainq_client._kinds import KindMethods, kind_name, route_for
from explainq_client.comparison import ComparisonResult
from explainq_client.errors import ServiceUnavailableError
from explainq_client.jobs import (
    CANCEL_ONLY,
    RESULT_SCHEMA_HEADER,
    Artifact,
    JobBase,
    JobPage,
    ModelList,
    ProgressBar,
    WaitClock,
    dataset_body,
    list_params,
    parse_entry,
)
from explainq_client.results import Result
from explainq_client.tables import export_frame, table_frame

__all__ = ["AsyncClient", "AsyncDatasets", "AsyncJob", "AsyncJobs", "AsyncModels"]


class AsyncClient(KindMethods[Awaitable["AsyncJob"]]):
    """An asynchronous connection to an explainq server (see :class:`explainq_client.Client`).

    ``base_url`` and ``api_key`` default to ``EXPLAINQ_URL`` (else ``http://127.0.0.1:8000``) and
    ``EXPLAINQ_API_KEY``. 429 and 503 answers and connection failures are retried (``max_retries`` times,
    after the server's ``Retry-After``); every submission carries an ``Idempotency-Key``, so a retried
    submission never creates a second job.

        async with AsyncClient() as client:
            job = await client.attributions(model="nrms-minilm-demo", samples=[...])
            result = await (await job.wait()).result()
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float | httpx.Timeout = 30.0, max_retries: int | None = None,
                 retry: RetryPolicy | None = None, transport: httpx.AsyncBaseTransport | None = None):
        self.config = ClientConfig.resolve(base_url, api_key, timeout, max_retries, retry)
        self._http = httpx.AsyncClient(base_url=self.config.base_url, headers=self.config.headers(),
                                       timeout=self.config.timeout, transport=transport)
        self.jobs = AsyncJobs(self)
        self.models = AsyncModels(self)
        self.datasets = AsyncDatasets(self)
        self._kinds: dict[str, dict[str, Any]] | None = None

    # ---- transport
    async def _send(self, method: str, path: str, *, stream: bool = False, retry_policy: RetryPolicy | None = None,
                    **kwargs: Any) -> httpx.Response:
        retry = RetryState(retry_policy or self.config.retry)
        # a download may be redirected to the store's pre-signed URL: httpx drops the API key on the way there
        follow = bool(kwargs.pop("follow_redirects", False))
        while True:
            request = self._http.build_request(method, path, **kwargs)
            try:
                response = await self._http.send(request, stream=stream, follow_redirects=follow)
            except httpx.TransportError as exc:
                await asyncio.sleep(retry.after_error(exc, f"{method} {request.url}"))
                continue
            if not response.is_success:
                await response.aread()
                await response.aclose()
            delay = retry.after_response(response)
            if delay is None:
                return response
            await asyncio.sleep(delay)

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Any API call, with the client's auth, retries and typed errors (``kwargs`` go to httpx)."""
        return await self._send(method, path, **kwargs)

    @asynccontextmanager
    async def _stream(self, path: str, params: dict[str, Any] | None = None) -> AsyncIterator[httpx.Response]:
        response = await self._send("GET", path, stream=True, params=params, timeout=self.config.stream_timeout(),
                                    follow_redirects=True)
        try:
            yield response
        finally:
            await response.aclose()

    async def _submit(self, kind_or_route: str, body: dict[str, Any], idempotency_key: str | None) -> AsyncJob:
        route = kind_or_route
        if not route.startswith("/"):
            route = route_for(kind_or_route, await self._kind_table())
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        return AsyncJob(self, (await self._send("POST", route, json=body, headers=headers)).json())

    # ---- the server's job kinds
    async def kinds(self) -> list[dict[str, Any]]:
        """``GET /kinds``: every job kind the server runs, as it describes itself; read once per client."""
        return list((await self._kind_table()).values())

    async def _kind_table(self) -> dict[str, dict[str, Any]]:
        if self._kinds is None:
            self._kinds = {k["name"]: k for k in (await self._send("GET", "/kinds")).json()["kinds"]}
        return self._kinds

    async def _renderer(self, kind: str | None) -> str | None:
        return ((await self._kind_table()).get(kind or "") or {}).get("renderer")

    async def estimate(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /kinds/{name}/estimate``: what a training run of ``kind`` with request ``body`` would cost, an
        estimate: ``examples``, ``steps`` and, from your latest succeeded run of the kind, ``seconds`` (None
        without one); counts are None when the dataset's size is not registered. An evaluation
        (``evaluate_attribution``, ``evaluate_mislabel``) also gives ``trainings`` and ``models``, ``seconds`` by
        the stated model ``k x examples x parameters`` (``basis``: ``measured`` on your latest train_conve run,
        or ``model``) and ``disk_bytes``."""
        name = kind_name(kind, await self._kind_table())
        return (await self._send("POST", f"/kinds/{quote(name)}/estimate", json=dict(body))).json()

    async def compare(self, a: Any, b: Any) -> ComparisonResult:
        """``GET /compare``: two succeeded jobs of one kind side by side (job ids, unique prefixes of them, or
        jobs): attributions per sample and per word, TracIn's lists (overlap, rank correlation, what entered and
        left), training runs' histories; deltas are b − a. Another owner's job raises :class:`NotFoundError`, one
        not succeeded :class:`ConflictError`, two kinds that differ :class:`ValidationError`."""
        ids = [getattr(j, "id", j) for j in (a, b)]
        return ComparisonResult((await self._send("GET", "/compare", params={"a": ids[0], "b": ids[1]})).json())

    async def delete_job(self, job_id: str) -> dict[str, Any]:
        """``DELETE /jobs/{id}`` of a finished job: its record, result and files are deleted; returns ``{"id",
        "deleted", "status", "files_removed"}``. A job still queued or running is canceled instead (its view is
        returned); a kept job raises :class:`ConflictError` (``kept``: ``job.unkeep()`` first)."""
        return (await self._send("DELETE", f"/jobs/{quote(job_id)}")).json()

    # ---- service
    async def health(self) -> dict[str, Any]:
        """``GET /health``: the API process is alive."""
        return (await self._send("GET", "/health")).json()

    async def ready(self) -> dict[str, Any]:
        """``GET /ready``: ``{"status": "ready"|"unavailable", "workers", "reasons"}``, asked once (its 503 is
        an answer, not a reason to retry)."""
        try:
            return (await self._send("GET", "/ready", retry_policy=NO_RETRY)).json()
        except ServiceUnavailableError as exc:
            return exc.response.json()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


class AsyncJob(JobBase):
    """A submitted job (asynchronous). Its view is refreshed by :meth:`refresh`, :meth:`wait` and :meth:`stream`."""

    def __init__(self, client: AsyncClient, view: dict[str, Any]):
        super().__init__(view)
        self._client = client

    async def refresh(self) -> AsyncJob:
        """Fetch the job's current view."""
        self._update((await self._client._send("GET", self.path)).json())
        return self

    async def wait(self, timeout: float | None = None, poll_interval: float = 1.0,
             progress: bool | None = None) -> AsyncJob:
        """Block until the job ends; returns the job when it succeeded.

        ``progress`` shows the job's progress as it waits, a ``tqdm.auto`` bar (a widget in a notebook, text
        on a terminal): None (the default) in a notebook where tqdm is installed, True always (tqdm must be
        installed), False never.

        Raises :class:`JobFailedError` / :class:`JobCanceledError` (with the job's ``code``) when it failed or
        was canceled, :class:`WaitTimeoutError` when ``timeout`` seconds passed first."""
        clock = WaitClock(self, timeout, poll_interval)
        bar = ProgressBar(self, progress)
        try:
            bar.update()
            while not self.done:
                await asyncio.sleep(clock.next_sleep())
                await self.refresh()
                bar.update()
        finally:
            bar.close()
        self._check_outcome()
        return self

    async def stream(self, interval_s: float | None = None) -> AsyncIterator[JobEvent]:
        """The job's events over SSE until it ends: a :class:`JobEvent` per change of its view (status or
        progress), then ``end`` (or ``gone`` when the job vanished). A dropped connection is reopened, at most
        ``max_retries`` times in a row."""
        params = {"interval_s": interval_s} if interval_s is not None else None
        retry = RetryState(self._client.config.retry)
        while True:
            parser = SSEParser()
            try:
                async with self._client._stream(self.path + "/events", params) as response:
                    async for line in response.aiter_lines():
                        event = self._on_line(parser, line)
                        if event is not None:
                            retry.reset()  # the budget is for consecutive drops
                            yield event
                            if event.event in ("end", "gone"):
                                return
                raise httpx.RemoteProtocolError("the event stream closed before its end event")
            except httpx.TransportError as exc:
                await asyncio.sleep(retry.after_error(exc, f"GET {self.path}/events"))

    async def result(self) -> Result:
        """The result of the succeeded job (a dict that renders itself in Jupyter). A job that has not
        succeeded raises :class:`ConflictError` (code ``not_ready``, ``failed`` or ``canceled``)."""
        if self._result is None:
            response = await self._client._send("GET", self.path + "/result")
            self._keep_result(response.json(), await self._client._renderer(self.kind),
                              response.headers.get(RESULT_SCHEMA_HEADER))
        assert self._result is not None
        return self._result

    async def entries(self, name: str) -> AsyncIterator[Any]:
        """Every entry of the result's list ``name``, in order, however many the result holds inline (see
        :meth:`explainq_client.Job.entries`): streamed from the JSONL artifact ``listed[name]`` names, or the
        result's own list when it holds it whole.

            async for entry in job.entries("results"):
                ...
        """
        artifact, inline = self._listed_source(await self.result(), name)
        if artifact is None:
            for entry in inline:
                yield entry
            return
        async with self._client._stream(self._artifact_path(artifact)) as response:
            async for line in response.aiter_lines():
                entry = parse_entry(line)
                if entry is not None:
                    yield entry

    async def table(self, name: str) -> Any:
        """The artifact ``name`` in full as a ``pandas.DataFrame`` (see :meth:`explainq_client.Job.table`)."""
        async with self._client._stream(self._artifact_path(name)) as response:
            data = b"".join([chunk async for chunk in response.aiter_bytes()])
        return table_frame(name, data)

    async def export(self, name: str, dest: str | Path, format: str | None = None) -> Path:  # noqa: A002
        """Write the artifact ``name`` to ``dest`` as Parquet, CSV or JSONL (see
        :meth:`explainq_client.Job.export`)."""
        return export_frame(await self.table(name), dest, format)

    async def cancel(self) -> AsyncJob:
        """Cancel: at once when queued, at its next step when running. A finished job raises
        :class:`ConflictError` (``already_finished``) and is left as it is."""
        self._update((await self._client._send("DELETE", self.path, params=CANCEL_ONLY)).json())
        return self

    async def keep(self) -> AsyncJob:
        """Keep the finished job: its record, result and files are exempt from the server's retention until
        :meth:`unkeep` (``POST /jobs/{id}/keep``). A job still queued or running raises :class:`ConflictError`
        (``not_finished``)."""
        self._update((await self._client._send("POST", self.path + "/keep")).json())
        return self

    async def unkeep(self) -> AsyncJob:
        """Undo :meth:`keep`: the job expires after the server's retention period again, counted from now."""
        self._update((await self._client._send("DELETE", self.path + "/keep")).json())
        return self

    async def delete(self) -> dict[str, Any]:
        """Delete the finished job with its result and files (``client.delete_job``)."""
        return await self._client.delete_job(self.id)

    async def artifacts(self) -> list[Artifact]:
        """The files the job wrote (``GET /jobs/{id}/artifacts``)."""
        return self._artifacts_from((await self._client._send("GET", self.path + "/artifacts")).json())

    async def download(self, dest: str | Path = ".", names: Iterable[str] | None = None) -> list[Path]:
        """Download the job's artifacts (all, or those ``names``) under ``dest``, keeping their relative paths.
        Each file is written under a temporary name and renamed when complete."""
        paths = []
        for artifact in self._select(await self.artifacts(), names):
            target = artifact_target(Path(dest), artifact.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(target.name + ".part")
            async with self._client._stream(artifact.url) as response:
                with open(part, "wb") as fh:
                    async for chunk in response.aiter_bytes():
                        fh.write(chunk)
            part.replace(target)
            paths.append(target)
        return paths


class AsyncJobs:
    """``client.jobs``: read, list and cancel jobs by id."""

    def __init__(self, client: AsyncClient):
        self._client = client

    async def get(self, job_id: str) -> AsyncJob:
        """The job ``job_id``; :class:`NotFoundError` when there is none for this API key."""
        return AsyncJob(self._client, (await self._client._send("GET", f"/jobs/{quote(job_id)}")).json())

    async def list(self, *, kind: str | None = None, status: str | None = None, limit: int | None = None,
                   cursor: str | None = None, q: str | None = None, tag: str | Sequence[str] | None = None,
                   model_digest: str | None = None) -> JobPage[AsyncJob]:
        """One page of the caller's jobs, newest first, optionally of one ``kind`` and ``status``, whose label,
        model, input, kind or id holds ``q`` (any case), carrying ``tag`` (one, or a list: every one of them),
        that read or registered a model version whose digest starts with ``model_digest`` (8 to 64 hex digits;
        a result's ``provenance.model_digest``)."""
        params = list_params(kind, status, limit, cursor, q, tag, model_digest)
        body = (await self._client._send("GET", "/jobs", params=params)).json()
        return JobPage.from_json(body, lambda view: AsyncJob(self._client, view))

    async def __call__(self, *, kind: str | None = None, status: str | None = None, limit: int | None = None,
                       cursor: str | None = None, q: str | None = None, tag: str | Sequence[str] | None = None,
                       model_digest: str | None = None) -> JobPage[AsyncJob]:
        """``await client.jobs(q="baseline", tag="nrms")``: the same as :meth:`list`."""
        return await self.list(kind=kind, status=status, limit=limit, cursor=cursor, q=q, tag=tag,
                               model_digest=model_digest)

    async def iter(self, *, kind: str | None = None, status: str | None = None, page_size: int = 100,
                   q: str | None = None, tag: str | Sequence[str] | None = None) -> AsyncIterator[AsyncJob]:
        """Every job (of ``kind`` and ``status``, matching ``q`` and ``tag``), newest first, following the
        pages."""
        cursor = None
        while True:
            page = await self.list(kind=kind, status=status, limit=page_size, cursor=cursor, q=q, tag=tag)
            for job in page.items:
                yield job
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def cancel(self, job_id: str) -> AsyncJob:
        """Cancel job ``job_id``; returns its view after the request."""
        return AsyncJob(self._client, (await self._client._send("DELETE", f"/jobs/{quote(job_id)}",
                                                                params=CANCEL_ONLY)).json())


class AsyncModels:
    """``client.models``: the registered models and datasets."""

    def __init__(self, client: AsyncClient):
        self._client = client

    async def list(self) -> ModelList:
        """``GET /models``."""
        return ModelList.from_json((await self._client._send("GET", "/models")).json())

    async def vocabulary(self, name: str, field: str = "entities", q: str | None = None,
                   limit: int | None = None) -> dict[str, Any]:
        """``GET /models/{name}/vocabulary``: a knowledge-graph model's ``entities`` or ``relations`` names,
        sorted, those holding ``q`` (any case) when given, at most ``limit`` (the server's bound: 1,000):
        ``{"model", "field", "total", "matched", "names"}``."""
        params = {k: v for k, v in (("field", field), ("q", q), ("limit", limit)) if v is not None}
        return (await self._client._send("GET", f"/models/{quote(name)}/vocabulary", params=params)).json()

    async def delete(self, name: str) -> dict[str, Any]:
        """``DELETE /models/{name}``: ``{"deleted", "kind", "owner"}``. Only its owner may delete a model
        (another owner's is a :class:`ConflictError`, an unknown one a :class:`NotFoundError`)."""
        return (await self._client._send("DELETE", f"/models/{quote(name)}")).json()


class AsyncDatasets:
    """``client.datasets``: register, look up and delete named datasets (directories under the data roots)."""

    def __init__(self, client: AsyncClient):
        self._client = client

    async def register(self, name: str, path: str, description: str | None = None, overwrite: bool = False
                       ) -> dict[str, Any]:
        """``POST /datasets``: register the directory ``path`` (under the data roots) as ``name``; the server
        detects and validates its format. Returns ``{"name", "kind", "owner", "format", "counts", "path",
        "created_at"}``. A path the server refuses (outside the data roots, no format it knows) is a
        :class:`ValidationError` naming ``path``; a name you already use, without ``overwrite=True``, or another
        owner's, a :class:`ConflictError`."""
        return (await self._client._send("POST", "/datasets", json=dataset_body(name, path, description, overwrite))).json()

    async def get(self, name: str) -> dict[str, Any]:
        """``GET /datasets/{name}``: ``{"name", "kind", "owner", "format", "counts", "created_at", "meta"}``;
        an unknown name is a :class:`NotFoundError`."""
        return (await self._client._send("GET", f"/datasets/{quote(name)}")).json()

    async def delete(self, name: str) -> dict[str, Any]:
        """``DELETE /datasets/{name}``: ``{"deleted", "kind", "owner"}``. Only its owner may delete a dataset
        (another owner's is a :class:`ConflictError`, an unknown one a :class:`NotFoundError`)."""
        return (await self._client._send("DELETE", f"/datasets/{quote(name)}")).json()
