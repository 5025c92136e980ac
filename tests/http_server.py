"""A real HTTP server (uvicorn in a thread) on the real app, for clients that must talk HTTP over a socket.

    with Service(home) as svc, HttpServer(svc.settings) as server:
        client = Client(server.url)
"""

from __future__ import annotations

import threading
import time

import uvicorn

from core.redis_server import free_port
from core.settings import Settings


class HttpServer:
    def __init__(self, settings: Settings, port: int | None = None):
        from app.main import create_app

        self.port = port or free_port()
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> HttpServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server on port {self.port} did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


KEYS = {"alice": "alice-key", "bob": "bob-key"}


def keyed_service(home):
    """A running service with two API keys (``KEYS``), a registered test model ``counter``, and a real HTTP
    server: yields ``(service, server)``."""
    from core import registry
    from tests.service import Service

    service = Service(home, api_keys=",".join(f"{n}:{k}" for n, k in KEYS.items()), heartbeat_ttl_s=20,
                      start=False)
    (home / "models" / "counter").mkdir(parents=True)
    registry.register_model(service.settings, "counter", kind="test", loader="tests.jobkinds:load_counter_model",
                            path=home / "models" / "counter", parameters=3, meta={"note": "<b>escaped</b>"})
    with service.start(), HttpServer(service.settings) as server:
        yield service, server
