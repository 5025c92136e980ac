"""``explainq``: run the whole service (``up``) or one part of it (``api``, ``worker``, ``redis``, ``demo``).

This module imports no torch: ``worker`` and ``demo`` import the worker side only when they run.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from core.logs import setup_logging
from core.redis_server import is_loopback
from core.settings import Settings

log = logging.getLogger("explainq")

TRAIN_NICE = 10  # the training worker's CPU priority under `explainq up`
WORKER_NICE = 5  # every other worker's under `explainq up`: below the API, whose requests come first


def _check_bind(host: str, settings: Settings) -> None:
    if not is_loopback(host) and not settings.api_keys:
        sys.exit(
            f"refusing to listen on {host}: no API keys are configured. Set EXPLAINQ_API_KEYS=name:key[,...] "
            "or listen on 127.0.0.1."
        )


# ------------------------------------------------------------------------------------------------ parts
def server_implementations() -> tuple[str, str]:
    """uvicorn's (event loop, HTTP parser): uvloop and httptools (dependencies of the package), or the pure-Python
    asyncio loop and h11 where those are missing."""
    import importlib.util

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return loop, http


def cmd_api(args: argparse.Namespace) -> None:
    import uvicorn

    settings = Settings()
    _check_bind(args.host, settings)
    loop, http = server_implementations()
    # log_config=None: uvicorn's records go through the root handler set up by main() (JSON or text).
    # app.main:served_app is a factory: each server process imports the app, then tunes its garbage collector.
    uvicorn.run("app.main:served_app", factory=True, host=args.host, port=args.port, workers=args.workers,
                log_level="info", access_log=not args.no_access_log, log_config=None, loop=loop, http=http)


def cmd_worker(args: argparse.Namespace) -> None:
    from workers.worker import apply_thread_budget

    apply_thread_budget(args.threads)  # before torch is imported
    if args.nice:
        os.nice(args.nice)
    from workers.worker import run_worker

    queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues else None
    settings = Settings()
    run_worker(settings, queues, burst=args.burst, preload=not args.no_preload, threads=args.threads,
               worker_class=args.worker_class or settings.worker_class or None)


def cmd_redis(args: argparse.Namespace) -> None:
    from core.redis_server import EmbeddedRedis, read_password_file

    settings = Settings()
    if args.no_password and not is_loopback(args.host):
        sys.exit(f"refusing to bind redis to {args.host} without a password: drop --no-password")
    if args.no_password:
        password: str | None = ""
    elif args.password_file and Path(args.password_file).exists():
        password = read_password_file(Path(args.password_file))
    else:
        password = None  # generated into --password-file (default EXPLAINQ_HOME/redis/password) on first start
    server = EmbeddedRedis(settings.home / "redis", port=args.port, host=args.host, password=password,
                           password_file=Path(args.password_file) if args.password_file else None).start()
    where = f" (password in {server.password_file})" if server.password else ""
    print(f"REDIS_URL={server.redacted_url}{where}", flush=True)
    log.info("redis listening on %s:%s%s", args.host, server.port, where)
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    while not stop["flag"] and server.alive():
        time.sleep(0.5)
    server.stop()


def cmd_gc(args: argparse.Namespace) -> None:
    import json

    from core.retention import collect

    removed = collect(Settings(), grace_s=args.grace_s)
    print(json.dumps({k: len(v) for k, v in removed.items()}), flush=True)


def cmd_demo(args: argparse.Namespace) -> None:
    if args.nice:
        os.nice(args.nice)
    # Stopped by `explainq up` (SIGTERM): unwind, so that its record in Redis says at once that it no longer runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    from workers.demo import prepare_all

    prepare_all(Settings(), progress=True, only=args.only)


# ------------------------------------------------------------------------------------------------ up
def worker_specs(args: argparse.Namespace) -> list[str]:
    """The queue list of each worker ``explainq up`` starts: ``--workers "explain,bulk;train"`` (workers separated by
    ``;``, each worker's queues in priority order), or the older ``--queues explain,train`` (one worker per queue)."""
    if getattr(args, "queues", None):
        return [q.strip() for q in args.queues.split(",") if q.strip()]
    return [",".join(q.strip() for q in w.split(",") if q.strip()) for w in args.workers.split(";") if w.strip()]


def split_threads(queues: list[str], cores: int) -> dict[str, tuple[int, int]]:
    """``queue spec -> (threads, nice)`` for the workers ``explainq up`` starts on a host with ``cores`` cores.

    Interactive workers (any spec other than ``train`` alone) share all cores at nice ``WORKER_NICE``, below the
    API process on the same host (its requests come first: ``benchmarks/fairness.py --api``); training workers
    share half of them at nice ``TRAIN_NICE``, so they only take what the interactive work leaves idle (training
    workers alone take all cores at ``WORKER_NICE``).
    """
    cores = max(cores, 1)
    train = [q for q in queues if q == "train"]
    interactive = [q for q in queues if q != "train"]
    plan: dict[str, tuple[int, int]] = {}
    for q in interactive:
        plan[q] = (max(1, cores // len(interactive)), WORKER_NICE)
    for q in train:
        share = cores // 2 if interactive else cores
        plan[q] = (max(1, share // len(train)), TRAIN_NICE if interactive else WORKER_NICE)
    return plan


def exit_reason(returncode: int) -> str:
    """``exit code 3`` or ``signal SIGKILL`` for a child's return code."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


class Restarts:
    """Exponential backoff for restarting one crashing process: ``initial`` s doubling up to ``cap`` s, back to
    ``initial`` once it has run ``healthy_s`` without dying."""

    def __init__(self, initial: float = 1.0, cap: float = 60.0, healthy_s: float = 60.0):
        self.initial, self.cap, self.healthy_s = initial, cap, healthy_s
        self.delay = initial

    def next_delay(self, ran_s: float) -> float:
        if ran_s >= self.healthy_s:
            self.delay = self.initial
        delay = self.delay
        self.delay = min(self.delay * 2, self.cap)
        return delay


def banner(host: str, port: int, listening: bool = True) -> str:
    """The line ``explainq up`` prints once the API listens (before the demo preparation and the workers): the
    dashboard's address."""
    if ":" in host:
        host = f"[{host}]"
    state = "is up" if listening else "is starting (the API does not answer yet)"
    return f"explainq {state}: dashboard http://{host}:{port}/ui  (API docs at /docs; Ctrl-C stops)"


DEMO_POLL_S = 0.5  # how often ``explainq up`` looks whether the demo's first model is ready
WORKERS_AT_LATEST_S = 180.0  # the workers start by then even when no demo model is ready (a slow or stuck step)


def first_model_ready(plan: dict | None) -> bool:
    """Whether the demo (``core.demo_status.read``) has registered a model, or registers none at all, so that the
    workers can start: a step with models is ``ready`` (a ``failed`` one does not count)."""
    if not plan or not plan.get("steps"):
        return False
    with_models = [s for s in plan["steps"] if s.get("models")]
    if not with_models:
        return True
    return any(s["state"] == "ready" for s in with_models)


class Supervisor:
    """Redis (embedded unless REDIS_URL is set), the API, the demo preparation in the background, and the workers
    (started as soon as the demo's first model is ready); restarts what dies, with exponential backoff for a
    process that keeps crashing."""

    def __init__(self, args: argparse.Namespace, backoff_s: float = 1.0, backoff_cap_s: float = 60.0,
                 healthy_s: float = 60.0):
        self.args = args
        self.settings = Settings()
        self.redis = None
        self.env = dict(os.environ)
        self.env["EXPLAINQ_HOME"] = str(self.settings.home)
        root = str(Path(__file__).resolve().parent.parent)
        self.env["PYTHONPATH"] = root + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        self.procs: dict[str, subprocess.Popen] = {}
        self.started_at: dict[str, float] = {}
        self.restart_at: dict[str, float] = {}
        self.restarts: dict[str, Restarts] = {}
        self.backoff = (backoff_s, backoff_cap_s, healthy_s)
        self.stopping = False
        self.demo: subprocess.Popen | None = None
        self.demo_started_at = 0.0
        self.workers_started = False
        self._demo_redis = None
        self._next_demo_poll = 0.0
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.plan = split_threads(worker_specs(args), cores)

    def argv(self, name: str) -> list[str]:
        """The command line of process ``name`` (``api`` or ``worker:<queues>``)."""
        if name == "api":
            return [sys.executable, "-m", "explainq.cli", "api", "--host", self.args.host, "--port", str(self.args.port)]
        queue = name.split(":", 1)[1]
        threads, nice = self.plan[queue]
        return [sys.executable, "-m", "explainq.cli", "worker", "--queues", queue, "--threads", str(threads),
                "--nice", str(nice)]

    def _spawn(self, name: str) -> None:
        log.info("starting %s", name)
        self.procs[name] = subprocess.Popen(self.argv(name), env=self.env)
        self.started_at[name] = time.monotonic()
        self.restart_at.pop(name, None)

    def start(self) -> None:
        self.settings.home.mkdir(parents=True, exist_ok=True)
        if not self.settings.redis_url:
            from core.redis_server import EmbeddedRedis

            self.redis = EmbeddedRedis(self.settings.home / "redis").start()
            self.env["REDIS_URL"] = self.redis.url
            log.info("embedded redis on %s (password in %s, AOF under %s)", self.redis.redacted_url,
                     self.redis.password_file, self.redis.data_dir)
        self._spawn("api")
        listening = self.wait_for_api()
        print(banner(self.args.host, self.args.port, listening), flush=True)
        if self.args.no_demo:
            self.start_workers()
            return
        log.info("preparing demo models and data in the background (first start only; cached under %s); the "
                 "workers start when the first model is ready", self.settings.home)
        self.demo = self._start_demo()
        self.demo_started_at = time.monotonic()

    def _start_demo(self) -> subprocess.Popen:
        """``explainq demo`` at the training workers' priority, so that interactive jobs come first."""
        return subprocess.Popen([sys.executable, "-m", "explainq.cli", "demo", "--nice", str(TRAIN_NICE)],
                                env=self.env)

    def start_workers(self) -> None:
        if self.workers_started:
            return
        self.workers_started = True
        for queue, (threads, nice) in self.plan.items():
            log.info("worker %s: %d cpu thread(s), nice %d", queue, threads, nice)
            self._spawn(f"worker:{queue}")
        log.info("workers started; the service is ready")

    def _demo_plan(self) -> dict | None:
        """The demo's plan and progress as recorded in Redis; None while Redis cannot tell."""
        from core import demo_status
        from core.redis_server import redis_client

        url = self.env.get("REDIS_URL") or self.settings.redis_url
        if not url:
            return None
        try:
            if self._demo_redis is None:
                self._demo_redis = redis_client(url, self.settings.redis_timeout_s)
            return demo_status.read(self._demo_redis)
        except Exception:  # Redis restarting: look again at the next poll
            return None

    def check_demo(self) -> None:
        """Start the workers once the demo's first model is ready, or once the demo process has ended."""
        if self.demo is None or self.workers_started:
            if self.demo is not None and self.demo.poll() is not None:
                self._demo_ended()
            return
        ended = self.demo.poll() is not None
        if not ended:
            if time.monotonic() < self._next_demo_poll:
                return
            self._next_demo_poll = time.monotonic() + DEMO_POLL_S
            if first_model_ready(self._demo_plan()):
                log.info("the first demo model is ready; starting the workers (the rest of the demo goes on)")
            elif time.monotonic() - self.demo_started_at >= WORKERS_AT_LATEST_S:
                log.warning("no demo model is ready after %.0f s; starting the workers anyway (the demo goes on)",
                            WORKERS_AT_LATEST_S)
            else:
                return
        self.start_workers()
        if ended:
            self._demo_ended()

    def _demo_ended(self) -> None:
        if self.demo is None:
            return
        if self.demo.returncode != 0:
            log.error("demo preparation failed (%s); the service runs without the missing demos",
                      exit_reason(self.demo.returncode))
        else:
            log.info("demo preparation finished")
        self.demo = None

    def wait_for_api(self, timeout_s: float = 60.0) -> bool:
        """Wait until the API accepts connections on its port; False when it exits or ``timeout_s`` passes first."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.args.host, self.args.host)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.procs["api"].poll() is not None:
                return False
            try:
                with socket.create_connection((host, self.args.port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.1)
        return False

    def _maybe_gc(self) -> None:
        """A gc pass every ``--gc-interval-s`` (in a child process, so a slow store never stalls supervision)."""
        if self.args.gc_interval_s <= 0 or time.monotonic() < self.next_gc:
            return
        if self.gc_proc is not None and self.gc_proc.poll() is None:
            return
        self.next_gc = time.monotonic() + self.args.gc_interval_s
        self.gc_proc = subprocess.Popen([sys.executable, "-m", "explainq.cli", "gc"], env=self.env,
                                        stdout=subprocess.DEVNULL)

    def check(self) -> None:
        """One supervision pass: restart Redis if it died, schedule and perform process restarts."""
        if self.redis is not None and not self.redis.alive():
            log.error("embedded redis died; restarting it on the same port")
            self.redis.start()
        now = time.monotonic()
        for name, proc in list(self.procs.items()):
            if self.stopping:
                return
            if name in self.restart_at:
                if now >= self.restart_at[name]:
                    self._spawn(name)
                continue
            if proc.poll() is None:
                continue
            ran = now - self.started_at[name]
            delay = self.restarts.setdefault(name, Restarts(*self.backoff)).next_delay(ran)
            log.error("%s died (%s) after %.1f s; restarting it in %.1f s", name, exit_reason(proc.returncode),
                      ran, delay)
            self.restart_at[name] = now + delay

    def supervise(self) -> None:
        self.next_gc = time.monotonic() + min(self.args.gc_interval_s, 60.0)
        self.gc_proc: subprocess.Popen | None = None
        while not self.stopping:
            self._maybe_gc()
            self.check_demo()
            self.check()
            time.sleep(0.2)

    def stop(self, *_: object) -> None:
        self.stopping = True

    def shutdown(self) -> None:
        log.info("stopping: workers finish or requeue their jobs, then the API and Redis stop")
        procs = dict(self.procs)
        if self.demo is not None and self.demo.poll() is None:
            procs["demo"] = self.demo  # idempotent steps: the next start finishes what it left
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.args.grace_s
        for name, proc in procs.items():
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
    up.add_argument("--workers", default="explain,bulk;train",
                    help="the workers to start, separated by ';', each with its queues in priority order: the "
                    "default serves interactive requests before dataset-scale shards on one worker and trains on "
                    "another")
    up.add_argument("--queues", default=None, help="older form: one worker per comma-separated queue")
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
    worker.add_argument("--queues", default=None, help="comma-separated, in priority order (default: the "
                        "class's queues with --class, else explain,bulk,train)")
    worker.add_argument("--class", dest="worker_class", default=None, metavar="NAME",
                        help="the worker class this worker belongs to (EXPLAINQ_WORKER_CLASSES; default "
                        "EXPLAINQ_WORKER_CLASS): it serves the class's queues and takes the jobs placed on it")
    worker.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    worker.add_argument("--no-preload", action="store_true", help="load models on first use instead")
    worker.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (intra-op), OpenMP and MKL in this worker; default: all cores")
    worker.add_argument("--nice", type=int, default=0, help="lower this worker's CPU priority by this much")
    worker.set_defaults(func=cmd_worker)

    red = sub.add_parser("redis", help="run the embedded redis-server alone (data under EXPLAINQ_HOME/redis)")
    red.add_argument("--host", default="127.0.0.1", help="address to bind; other hosts need a password")
    red.add_argument("--port", type=int, default=None)
    red.add_argument("--password-file", default=None,
                     help="file holding the password (created, mode 0600, if missing); "
                     "default EXPLAINQ_HOME/redis/password")
    red.add_argument("--no-password", action="store_true", help="no password (loopback addresses only)")
    red.set_defaults(func=cmd_redis)

    gc = sub.add_parser("gc", help="delete artifacts of expired jobs and unreferenced model/dataset versions")
    gc.add_argument("--grace-s", type=float, default=3600.0,
                    help="keep replaced versions and unregistered uploads younger than this")
    gc.set_defaults(func=cmd_gc)

    demo = sub.add_parser("demo", help="prepare the demo models and data (idempotent)")
    demo.add_argument("--only", default=None,
                      help="comma-separated job modules or step names, e.g. train_conve,nrms-minilm-demo")
    demo.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
