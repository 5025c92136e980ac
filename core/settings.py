"""Service settings, read from the environment (and an optional ``.env`` file).

| variable | meaning | default |
|---|---|---|
| ``REDIS_URL`` | Redis to use; unset means ``explainq up`` starts a private one | unset |
| ``EXPLAINQ_HOME`` | data directory: models, datasets, artifacts, caches, embedded Redis | ``./var`` |
| ``EXPLAINQ_API_KEYS`` | ``name:key`` pairs, comma separated; empty disables auth (loopback only) | empty |
| ``EXPLAINQ_DATA_ROOTS`` | ``os.pathsep``-separated directories user paths may point into | ``$EXPLAINQ_HOME/data`` |
| ``EXPLAINQ_MAX_BODY_BYTES`` | request body limit | 8 MiB |
| ``EXPLAINQ_MAX_ACTIVE_JOBS`` | queued-or-running jobs one API key may have; more is ``429`` | 100 |
| ``EXPLAINQ_MAX_QUEUE_LENGTH`` | jobs waiting in one queue; more is ``429`` | 10000 |
| ``EXPLAINQ_SHARD_WINDOW`` | shards one API key may have out on the ``bulk`` queue (queued or running); ``0``: as many as live workers serve ``bulk`` | 0 |
| ``EXPLAINQ_MAX_SHARDS`` | shards one fanned-out job may have; a ``shard_size`` that would make more is ``422`` (``auto`` grows to fit) | 1000 |
| ``EXPLAINQ_RESULT_TTL_S`` | how long succeeded jobs and results stay in Redis | 7 days |
| ``EXPLAINQ_FAILURE_TTL_S`` | how long failed and canceled jobs stay in Redis | 7 days |
| ``EXPLAINQ_TENANT_STORE_BYTES`` | a tenant's stored bytes (``GET /usage``) at or over this refuse new jobs with ``413 store_budget_exceeded``; ``0``: no budget | 0 |
| ``EXPLAINQ_TENANT_COMPUTE_S`` | estimated seconds of a tenant's queued and running jobs, the new one's included, over this are ``429 compute_budget_exceeded``; ``0``: no budget | 0 |
| ``EXPLAINQ_USAGE_CACHE_S`` | how long a tenant's measured stored bytes are reused by the store budget's check | 60 |
| ``EXPLAINQ_CACHE_TTL_S`` | ``explainq gc`` deletes gradient features and evaluation caches not used for this long; ``0``: never | 30 days |
| ``EXPLAINQ_RESULT_INLINE_BYTES`` | a result larger than this (as JSON) is written to the store (``results/<job id>.json``) and Redis keeps a pointer; ``0``: every result | 65536 |
| ``EXPLAINQ_HEARTBEAT_TTL_S`` | a running job whose worker is silent this long is abandoned | 60 |
| ``EXPLAINQ_STORE`` | the shared file store (models, datasets, artifacts): a directory or an fsspec URL | ``$EXPLAINQ_HOME/store`` |
| ``EXPLAINQ_STORE_CACHE`` | ``auto``: read a file-system store in place, copy others into the host's cache; ``always``: copy every store | ``auto`` |
| ``EXPLAINQ_STORE_TIMEOUT_S`` | how long one store call may go without an answer (plus a second per MiB it moves; a streamed read, per chunk); 0: no bound | 30 |
| ``EXPLAINQ_STORE_RETRIES`` | retries of a store call that timed out or met an outage (0.5 s, 1 s, 2 s, ... apart), then it fails as ``store_unavailable`` | 3 |
| ``EXPLAINQ_PRESIGNED_URL_TTL_S`` | how long the pre-signed URL an artifact download redirects to stays valid, where the store signs URLs (S3); 0: the API streams every download | 300 |
| ``EXPLAINQ_MODEL_CACHE_BYTES`` | memory budget of a worker's loaded models (least recently used ones are dropped) | 4 GiB |
| ``EXPLAINQ_WORKER_MEMORY_BYTES`` | memory a training job may need on a worker (``core/memory.py`` estimates it at submission; more is ``422``); 0: no check | 8 GiB |
| ``EXPLAINQ_WORKER_CLASSES`` | the worker classes, as JSON: name -> ``{queues, gpu, gpu_memory_gib, memory_gib}``; a job goes only to a class that can run it (``core/placement.py``); the API and every worker read the same value | empty: no classes |
| ``EXPLAINQ_WORKER_CLASS`` | the class this worker belongs to (``explainq worker --class``) | empty |
| ``EXPLAINQ_WORKER_RESOURCES`` | what this worker has, as JSON ``{gpu, gpu_memory_gib, gpu_name}``, instead of what it detects | empty: detected |
| ``EXPLAINQ_BACKLOG_UNKNOWN_COST_S`` | seconds a queued job or shard of a kind with no finished run counts in the backlog's estimated cost | 60 |
| ``EXPLAINQ_PARSER_MEMORY_BYTES`` | address space of the child process that reads a user file's content for the API (``core/bounded.py``); more is ``413`` | 2 GiB |
| ``EXPLAINQ_PARSER_CPU_S`` | CPU seconds that child may use; more is ``422`` | 60 |
| ``EXPLAINQ_PARSER_TIMEOUT_S`` | wall-clock seconds that child may run; more is ``422`` | 120 |
| ``EXPLAINQ_PARSER_LINE_BYTES`` | the longest line it reads of a text file (triples, TSV, CSV, JSON lines); longer is ``422`` | 16 MiB |
| ``EXPLAINQ_PARSER_CONCURRENCY`` | those children one API process runs at once (at most this many times the memory above); a parse that waits longer than the timeout for one is ``503`` | 4 |
| ``EXPLAINQ_RATE_LIMIT_PER_S`` | requests a second one API key may make, on average (a token bucket in Redis, ``core/ratelimit.py``); more is ``429`` with ``Retry-After``; 0: no limit | 50 |
| ``EXPLAINQ_RATE_LIMIT_BURST`` | requests one API key may make at once (the bucket's size) | 500 |
| ``EXPLAINQ_LOGIN_RATE_PER_MIN`` | dashboard sign-in attempts a minute from one client address, on average; more is ``429``; 0: no limit | 30 |
| ``EXPLAINQ_LOGIN_BURST`` | sign-in attempts one client address may make at once | 100 |
| ``EXPLAINQ_REDIS_RETRY_S`` | how long a worker keeps retrying Redis writes (progress, results) while Redis is down | 120 |
| ``EXPLAINQ_LOG_FORMAT`` | ``json`` (one object per line) or ``text`` | ``json`` |
| ``EXPLAINQ_KIND_PLUGINS`` | comma-separated ``module:function`` hooks the API and every worker call at start to register extra kinds (``core.contract.kind.load_kinds``) | empty |
"""

from __future__ import annotations

import hashlib
import os
from functools import cached_property
from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _alias(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


class Settings(BaseSettings):
    """The settings in the module's table.

    Retention: when ``EXPLAINQ_RESULT_TTL_S`` / ``EXPLAINQ_FAILURE_TTL_S`` are set (environment, ``.env`` or an
    explicit argument) every job kind follows them. Only when ``EXPLAINQ_RESULT_TTL_S`` is unset does a kind's own
    longer default (``JobKind.result_ttl_s``, e.g. 30 days for training runs) apply (``result_ttl_for``). Failed and
    canceled jobs (a canceled queued job included) expire after ``EXPLAINQ_FAILURE_TTL_S``.
    """

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    redis_url: str | None = Field(None, validation_alias=_alias("REDIS_URL"))
    home_dir: Path = Field(Path("./var"), validation_alias=_alias("EXPLAINQ_HOME"))
    api_keys_raw: str = Field("", validation_alias=_alias("EXPLAINQ_API_KEYS"))
    data_roots_raw: str = Field("", validation_alias=_alias("EXPLAINQ_DATA_ROOTS"))
    max_body_bytes: int = Field(8 * 1024 * 1024, validation_alias=_alias("EXPLAINQ_MAX_BODY_BYTES"))
    max_active_jobs: int = Field(100, ge=1, validation_alias=_alias("EXPLAINQ_MAX_ACTIVE_JOBS"))
    max_queue_length: int = Field(10_000, ge=1, validation_alias=_alias("EXPLAINQ_MAX_QUEUE_LENGTH"))
    shard_window: int = Field(0, ge=0, validation_alias=_alias("EXPLAINQ_SHARD_WINDOW"))
    max_shards: int = Field(1000, ge=1, validation_alias=_alias("EXPLAINQ_MAX_SHARDS"))
    result_ttl_s: int = Field(7 * 24 * 3600, validation_alias=_alias("EXPLAINQ_RESULT_TTL_S"))
    failure_ttl_s: int = Field(7 * 24 * 3600, validation_alias=_alias("EXPLAINQ_FAILURE_TTL_S"))
    # a larger result (as JSON) goes to the store, Redis keeping a pointer (core/results.py); 0: every result
    result_inline_bytes: int = Field(64 * 1024, ge=0, validation_alias=_alias("EXPLAINQ_RESULT_INLINE_BYTES"))
    # per-tenant budgets (core/budgets.py); 0: none
    tenant_store_bytes: int = Field(0, ge=0, validation_alias=_alias("EXPLAINQ_TENANT_STORE_BYTES"))
    tenant_compute_s: float = Field(0.0, ge=0, validation_alias=_alias("EXPLAINQ_TENANT_COMPUTE_S"))
    usage_cache_s: int = Field(60, ge=0, validation_alias=_alias("EXPLAINQ_USAGE_CACHE_S"))
    # shared features and evaluation caches not used for this long are collected (core/lastuse.py)
    cache_ttl_s: int = Field(30 * 24 * 3600, ge=0, validation_alias=_alias("EXPLAINQ_CACHE_TTL_S"))
    heartbeat_ttl_s: int = Field(60, validation_alias=_alias("EXPLAINQ_HEARTBEAT_TTL_S"))
    redis_timeout_s: float = Field(2.0, validation_alias=_alias("EXPLAINQ_REDIS_TIMEOUT_S"))
    store_raw: str = Field("", validation_alias=_alias("EXPLAINQ_STORE"))
    store_cache_mode: str = Field("auto", pattern="^(auto|always)$", validation_alias=_alias("EXPLAINQ_STORE_CACHE"))
    store_timeout_s: float = Field(30.0, ge=0, validation_alias=_alias("EXPLAINQ_STORE_TIMEOUT_S"))
    store_retries: int = Field(3, ge=0, le=20, validation_alias=_alias("EXPLAINQ_STORE_RETRIES"))
    presigned_url_ttl_s: int = Field(300, ge=0, le=7 * 24 * 3600,
                                     validation_alias=_alias("EXPLAINQ_PRESIGNED_URL_TTL_S"))
    model_cache_bytes: int = Field(4 * 1024**3, ge=0, validation_alias=_alias("EXPLAINQ_MODEL_CACHE_BYTES"))
    # what one training job may need on a worker (the API host cannot see the workers' memory: a fixed budget)
    worker_memory_bytes: int = Field(8 * 1024**3, ge=0, validation_alias=_alias("EXPLAINQ_WORKER_MEMORY_BYTES"))

    def result_ttl_for(self, kind_default: int | None) -> int:
        """A kind's result TTL: ``EXPLAINQ_RESULT_TTL_S`` when it is set, else the kind's default, else ours."""
        if "result_ttl_s" in self.model_fields_set or kind_default is None:
            return self.result_ttl_s
        return kind_default

    @cached_property
    def home(self) -> Path:
        return self.home_dir.expanduser().resolve()

    @cached_property
    def data_roots(self) -> list[Path]:
        roots = [p for p in self.data_roots_raw.split(os.pathsep) if p.strip()]
        if not roots:
            return [self.home / "data"]
        return [Path(p).expanduser().resolve() for p in roots]

    @cached_property
    def api_keys(self) -> dict[str, str]:
        """key -> name. Malformed entries raise so a typo never silently disables auth."""
        out: dict[str, str] = {}
        for item in self.api_keys_raw.split(","):
            item = item.strip()
            if not item:
                continue
            name, sep, key = item.partition(":")
            if not sep or not name or not key:
                raise ValueError("EXPLAINQ_API_KEYS must be comma-separated name:key pairs")
            out[key] = name
        return out

    @cached_property
    def _key_by_digest(self) -> dict[bytes, str]:
        return {hashlib.sha256(key.encode()).digest(): key for key in self.api_keys}

    def api_key_for(self, supplied: str) -> str | None:
        """The configured API key equal to ``supplied``, or None.

        One dict lookup by the SHA-256 of ``supplied``: the time taken does not depend on how much of a configured
        key the supplied one matches (a digest's prefix says nothing about the key's), nor on the number of keys.
        """
        return self._key_by_digest.get(hashlib.sha256(supplied.encode()).digest())

    @property
    def store_url(self) -> str:
        """The store's fsspec URL; a plain path (relative paths resolved now) or the default under the home."""
        raw = self.store_raw.strip()
        if not raw:
            return str(self.home / "store")
        if "://" in raw or "::" in raw:
            return raw
        return str(Path(raw).expanduser().resolve())

    @property
    def store_cache_dir(self) -> Path:
        return self.home / "cache" / "store"

    @property
    def work_dir(self) -> Path:
        """This host's scratch space for running jobs (their artifacts before they reach the store)."""
        return self.home / "work"

    # Placement (core/placement.py) and the backlog's cost (core/backlog.py).
    worker_classes_raw: str = Field("", validation_alias=_alias("EXPLAINQ_WORKER_CLASSES"))
    worker_class: str = Field("", validation_alias=_alias("EXPLAINQ_WORKER_CLASS"))
    worker_resources_raw: str = Field("", validation_alias=_alias("EXPLAINQ_WORKER_RESOURCES"))
    backlog_unknown_cost_s: float = Field(60.0, ge=0, le=86_400,
                                          validation_alias=_alias("EXPLAINQ_BACKLOG_UNKNOWN_COST_S"))

    @field_validator("worker_classes_raw")
    @classmethod
    def _classes_parse(cls, raw: str) -> str:
        from core.placement import parse_classes  # placement builds on the kinds, which build on settings

        parse_classes(raw)  # a ValueError naming EXPLAINQ_WORKER_CLASSES and the entry
        return raw

    # The bounded parser (core/bounded.py): the child process that reads user files' content for the API.
    parser_memory_bytes: int = Field(2 << 30, ge=64 << 20, validation_alias=_alias("EXPLAINQ_PARSER_MEMORY_BYTES"))
    parser_cpu_s: int = Field(60, ge=1, le=86_400, validation_alias=_alias("EXPLAINQ_PARSER_CPU_S"))
    parser_timeout_s: float = Field(120.0, gt=0, le=86_400, validation_alias=_alias("EXPLAINQ_PARSER_TIMEOUT_S"))
    parser_line_bytes: int = Field(16 << 20, ge=1024, validation_alias=_alias("EXPLAINQ_PARSER_LINE_BYTES"))
    parser_concurrency: int = Field(4, ge=1, le=256, validation_alias=_alias("EXPLAINQ_PARSER_CONCURRENCY"))
    # how much lower the parser's children run than the API (nice increment, 0-19): a long read yields the CPUs
    parser_nice: int = Field(10, ge=0, le=19, validation_alias=_alias("EXPLAINQ_PARSER_NICE"))

    # The bounded checkpoint load (models/bounded_load.py): the child process that unpickles a tenant's weights
    # for a worker. Memory is what the load may add beyond torch's own mappings and the file's size.
    worker_load_memory_bytes: int = Field(1 << 30, ge=64 << 20,
                                          validation_alias=_alias("EXPLAINQ_WORKER_LOAD_MEMORY_BYTES"))
    worker_load_cpu_s: int = Field(300, ge=1, le=86_400, validation_alias=_alias("EXPLAINQ_WORKER_LOAD_CPU_S"))
    worker_load_timeout_s: float = Field(600.0, gt=0, le=86_400,
                                         validation_alias=_alias("EXPLAINQ_WORKER_LOAD_TIMEOUT_S"))
    # a warm child (torch imported once per worker) forks each load's child; off: a fresh Python per load
    worker_load_warm: bool = Field(True, validation_alias=_alias("EXPLAINQ_WORKER_LOAD_WARM"))

    # Rate limits (core/ratelimit.py): per tenant (all its keys and sessions), and dashboard sign-ins per address.
    rate_limit_per_s: float = Field(50.0, ge=0, le=1e6, validation_alias=_alias("EXPLAINQ_RATE_LIMIT_PER_S"))
    rate_limit_burst: int = Field(500, ge=1, le=10**7, validation_alias=_alias("EXPLAINQ_RATE_LIMIT_BURST"))
    login_rate_per_min: float = Field(30.0, ge=0, le=1e6, validation_alias=_alias("EXPLAINQ_LOGIN_RATE_PER_MIN"))
    login_burst: int = Field(100, ge=1, le=10**6, validation_alias=_alias("EXPLAINQ_LOGIN_BURST"))

    @property
    def key_rate_limit(self):  # noqa: ANN201 - core.ratelimit.Limit (imported here to keep settings light)
        from core.ratelimit import Limit

        return Limit("key", self.rate_limit_per_s, self.rate_limit_burst,
                     "EXPLAINQ_RATE_LIMIT_PER_S, EXPLAINQ_RATE_LIMIT_BURST")

    @property
    def login_rate_limit(self):  # noqa: ANN201 - core.ratelimit.Limit
        from core.ratelimit import Limit

        return Limit("login", self.login_rate_per_min / 60.0, self.login_burst,
                     "EXPLAINQ_LOGIN_RATE_PER_MIN, EXPLAINQ_LOGIN_BURST")

    # Worker fault tolerance, logging and kind plugins.
    redis_retry_s: float = Field(120.0, ge=0, validation_alias=_alias("EXPLAINQ_REDIS_RETRY_S"))
    log_format: str = Field("json", pattern="^(json|text)$", validation_alias=_alias("EXPLAINQ_LOG_FORMAT"))
    kind_plugins_raw: str = Field("", validation_alias=_alias("EXPLAINQ_KIND_PLUGINS"))
