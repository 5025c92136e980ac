"""A served app without workers for the dashboard's forms and jobs list: a private Redis, two API keys, a
registered news model and a toy ConvE model (vocabulary and config only: no job here loads them).
Submitted jobs stay queued."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from core import registry
from core.redis_server import EmbeddedRedis
from core.settings import Settings
from tests.http_server import HttpServer

KEYS = "alice:forms-key-alice-0123456789,bob:forms-key-bob-0123456789"
ALICE, BOB = "forms-key-alice-0123456789", "forms-key-bob-0123456789"
NEWS = "news-forms"
CONVE = "conve-forms"
ENTITIES = [f"country{i:02d}" for i in range(30)] + ["usa", "uk", "burma"]
RELATIONS = ["embassy", "treaties", "intergovorgs"]


def register_models(settings: Settings, home: Path) -> None:
    news = home / "models" / NEWS
    news.mkdir(parents=True)
    (news / "config.json").write_text("{}")
    registry.register_model(settings, NEWS, kind="news", loader="models.news.checkpoint:load", path=news,
                            parameters=1)
    conve = home / "models" / CONVE
    (conve / "data").mkdir(parents=True)
    (conve / "data" / "entities.dict").write_text("".join(f"{e}\t{i}\n" for i, e in enumerate(ENTITIES)))
    (conve / "data" / "relations.dict").write_text("".join(f"{r}\t{i}\n" for i, r in enumerate(RELATIONS)))
    (conve / "config.json").write_text(json.dumps({"checkpoints": [
        {"file": "checkpoints/epoch_0001.safetensors", "epoch": 1, "lr": 0.01}]}))
    registry.register_model(settings, CONVE, kind="conve", loader="models.kg.checkpoint:load", path=conve,
                            owner="system")


@contextmanager
def serve(home: Path) -> Iterator[tuple[Settings, str]]:
    redis = EmbeddedRedis(home / "redis", appendonly=False).start()
    try:
        settings = Settings(EXPLAINQ_HOME=str(home), REDIS_URL=redis.url, EXPLAINQ_API_KEYS=KEYS,
                            EXPLAINQ_MAX_ACTIVE_JOBS=1000)
        register_models(settings, home)
        with HttpServer(settings) as http:
            yield settings, http.url
    finally:
        redis.stop()


def api(url: str, key: str = ALICE) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
