"""``explainq``: run the whole service (``up``) or one part of it (``api``, ``worker``, ``redis``, ``demo``).

This module imports no torch: ``worker`` and ``demo`` import the worker side only when they run.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.settings import Settings

log = logging.getLogger("explainq")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_bind(host: str, settings: Settings) -> None:
    if not _is_loopback(host) and not settings.api_keys:
        sys.exit(
            f"refusing to listen on {host}: no API keys are configured. Set EXPLAINQ_API_KEYS=name:key[,...] "
            "or listen on 127.0.0.1."
        )


# ------------------------------------------------------------------------------------------------ parts
def cmd_api(args: argparse.Namespace) -> None:
    import uvicorn

    settings = Settings()
    _check_bind(args.host, settings)
    uvicorn.run("app.main:app", host=args.host, port=args.port, workers=args.workers, log_level="info",
                access_log=not args.no_access_log)


def cmd_worker(args: argparse.Namespace) -> None:
    from workers.worker import run_worker

    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    run_worker(Settings(), queues, burst=args.burst, preload=not args.no_preload)


def cmd_redis(args: argparse.Namespace) -> None:
    from app.redis_server import EmbeddedRedis

    settings = Settings()
    server = EmbeddedRedis(settings.home / "redis", port=args.port).start()
    print(f"REDIS_URL={server.url}", flush=True)
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    while not stop["flag"] and server.alive():
        time.sleep(0.5)
    server.stop()


def cmd_gc(args: argparse.Namespace) -> None:
    import json

    from app.gc import collect

    removed = collect(Settings(), grace_s=args.grace_s)
    print(json.dumps({k: len(v) for k, v in removed.items()}), flush=True)


def cmd_demo(args: argparse.Namespace) -> None:
    from workers.demo import prepare_all

    prepare_all(Settings(), progress=True, only=args.only)


# ------------------------------------------------------------------------------------------------ up
class Supervisor:
    """Redis (embedded unless REDIS_URL is set), the API, and one worker per queue; restarts what dies."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.settings = Settings()
        self.redis = None
        self.env = dict(os.environ)
        self.env["EXPLAINQ_HOME"] = str(self.settings.home)
        root = str(Path(__file__).resolve().parent.parent)
        self.env["PYTHONPATH"] = root + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopping = False

    def _spawn(self, name: str, argv: list[str]) -> None:
        log.info("starting %s", name)
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "app.cli", *argv], env=self.env)

    def _worker_argv(self, queue: str) -> list[str]:
        return ["worker", "--queues", queue]

    def start(self) -> None:
        self.settings.home.mkdir(parents=True, exist_ok=True)
        if not self.settings.redis_url:
            from app.redis_server import EmbeddedRedis

            self.redis = EmbeddedRedis(self.settings.home / "redis").start()
            self.env["REDIS_URL"] = self.redis.url
            log.info("embedded redis on %s (AOF under %s)", self.redis.url, self.redis.data_dir)
        self._spawn("api", ["api", "--host", self.args.host, "--port", str(self.args.port)])
        if not self.args.no_demo:
            log.info("preparing demo models and data (first start only; cached under %s)", self.settings.home)
            demo = subprocess.run([sys.executable, "-m", "app.cli", "demo"], env=self.env)
            if demo.returncode != 0:
                log.error("demo preparation failed (exit %s); the service runs without the missing demos",
                          demo.returncode)
        for queue in self.args.queues.split(","):
            self._spawn(f"worker:{queue}", self._worker_argv(queue))
        print(f"explainq is up: http://{self.args.host}:{self.args.port}/docs  (Ctrl-C stops)", flush=True)

    def _maybe_gc(self) -> None:
        """A gc pass every ``--gc-interval-s`` (in a child process, so a slow store never stalls supervision)."""
        if self.args.gc_interval_s <= 0 or time.monotonic() < self.next_gc:
            return
        if self.gc_proc is not None and self.gc_proc.poll() is None:
            return
        self.next_gc = time.monotonic() + self.args.gc_interval_s
        self.gc_proc = subprocess.Popen([sys.executable, "-m", "app.cli", "gc"], env=self.env,
                                        stdout=subprocess.DEVNULL)

    def supervise(self) -> None:
        self.next_gc = time.monotonic() + min(self.args.gc_interval_s, 60.0)
        self.gc_proc: subprocess.Popen | None = None
        while not self.stopping:
            self._maybe_gc()
            if self.redis is not None and not self.redis.alive():
                log.error("embedded redis died; restarting it on the same port")
                self.redis.start()
            for name, proc in list(self.procs.items()):
                if proc.poll() is not None and not self.stopping:
                    log.error("%s exited with %s; restarting it", name, proc.returncode)
                    argv = ["api", "--host", self.args.host, "--port", str(self.args.port)] if name == "api" \
                        else self._worker_argv(name.split(":", 1)[1])
                    time.sleep(0.5)
                    self._spawn(name, argv)
            time.sleep(0.5)

    def stop(self, *_: object) -> None:
        self.stopping = True

    def shutdown(self) -> None:
        log.info("stopping: workers finish or requeue their jobs, then the API and Redis stop")
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.args.grace_s
        for name, proc in self.procs.items():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %ss; killing it", name, self.args.grace_s)
                proc.kill()
                proc.wait()
        if self.redis is not None:
            self.redis.stop()


def cmd_up(args: argparse.Namespace) -> None:
    settings = Settings()
    _check_bind(args.host, settings)
    sup = Supervisor(args)
    signal.signal(signal.SIGTERM, sup.stop)
    signal.signal(signal.SIGINT, sup.stop)
    try:
        sup.start()
        sup.supervise()
    finally:
        sup.shutdown()


# ------------------------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="explainq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start Redis (embedded unless REDIS_URL is set), workers and the API")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--queues", default="explain,train", help="one worker is started per queue")
    up.add_argument("--no-demo", action="store_true", help="skip preparing the demo models and data")
    up.add_argument("--grace-s", type=float, default=30.0, help="how long workers get to stop on shutdown")
    up.add_argument("--gc-interval-s", type=float, default=3600.0,
                    help="run `explainq gc` this often (0 disables); the first pass runs a minute after start")
    up.set_defaults(func=cmd_up)

    api = sub.add_parser("api", help="run the HTTP API only")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8000)
    api.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    api.add_argument("--no-access-log", action="store_true")
    api.set_defaults(func=cmd_api)

    worker = sub.add_parser("worker", help="run one worker (models preloaded from the registry)")
    worker.add_argument("--queues", default="explain,train", help="comma-separated, in priority order")
    worker.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    worker.add_argument("--no-preload", action="store_true", help="load models on first use instead")
    worker.set_defaults(func=cmd_worker)

    red = sub.add_parser("redis", help="run the embedded redis-server alone (data under EXPLAINQ_HOME/redis)")
    red.add_argument("--port", type=int, default=None)
    red.set_defaults(func=cmd_redis)

    gc = sub.add_parser("gc", help="delete artifacts of expired jobs and unreferenced model/dataset versions")
    gc.add_argument("--grace-s", type=float, default=3600.0,
                    help="keep replaced versions and unregistered uploads younger than this")
    gc.set_defaults(func=cmd_gc)

    demo = sub.add_parser("demo", help="prepare the demo models and data (idempotent)")
    demo.add_argument("--only", default=None, help="comma-separated job modules, e.g. tracin,attributions")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
