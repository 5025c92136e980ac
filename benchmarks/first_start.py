"""How long a first ``explainq up`` takes to become useful, measured from outside over HTTP only.

Starts ``explainq up`` (this checkout) with an empty ``EXPLAINQ_HOME`` on a free port, then polls the API every
0.25 s and records, from the moment the command was started:

  api          the API answers ``GET /health``
  first model  ``GET /models`` lists a registered model
  worker       ``GET /ready`` counts a live worker on the ``explain`` queue
  first job    a job submitted for that model (the README's TracIn or attribution example) has succeeded
  demo done    every demo model is registered (``--all``; otherwise the run stops after the first job)

    python benchmarks/first_start.py [--all] [--timeout-s 900]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO_MODELS = {"conve-nations-demo", "nrms-minilm-demo", "nrms-minilm-poisoned-demo", "nrms-word-demo", "naml-demo"}
JOBS = {
    "conve": ("/tracin", {"test_triples": [["usa", "embassy", "uk"]], "top_k": 3}),
    "news": ("/attributions", {"samples": [{"id": "u1", "history": ["Lakers beat Celtics in overtime thriller"],
                                            "candidate": "SHOCKING: Dodgers sign star quarterback"}],
                               "n_steps": 16, "top_k": 3}),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="wait until every demo model is registered")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--root", default=str(ROOT), help="the checkout to start (default: this one)")
    parser.add_argument("--log", default=None, help="write explainq up's output here (default: discarded)")
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="explainq-first-start-")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "EXPLAINQ_API_KEYS")}
    env.update(EXPLAINQ_HOME=home, PYTHONPATH=args.root)
    out = open(args.log, "w") if args.log else subprocess.DEVNULL  # noqa: SIM115
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "explainq.cli", "up", "--port", str(port)], cwd=args.root, env=env,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    marks: dict[str, float] = {}
    first_model: dict | None = None
    job_id = None
    try:
        while time.monotonic() - t0 < args.timeout_s and proc.poll() is None:
            now = time.monotonic() - t0
            try:
                if "api" not in marks:
                    if call(base, "GET", "/health")[0] == 200:
                        marks["api"] = now
                    else:
                        time.sleep(0.25)
                        continue
                models = [m for m in call(base, "GET", "/models")[1].get("models", [])
                          if m.get("status", "ready") == "ready"]  # not the ones still being prepared
                registered = {m["name"]: m for m in models}
                if first_model is None:
                    demo = [m for m in models if m["name"] in DEMO_MODELS]
                    if demo:
                        first_model = demo[0]
                        marks["first model"] = now
                if "worker" not in marks and call(base, "GET", "/ready")[1].get("workers", {}).get("explain"):
                    marks["worker"] = now
                if first_model is not None and "worker" in marks and job_id is None:
                    route, body = JOBS[first_model["kind"]]
                    code, answer = call(base, "POST", route, {"model": first_model["name"], **body})
                    if code == 202:
                        job_id = answer["id"]
                if job_id is not None and "first job" not in marks:
                    status = call(base, "GET", f"/jobs/{job_id}")[1].get("status")
                    if status == "succeeded":
                        marks["first job"] = now
                    elif status in ("failed", "canceled"):
                        raise SystemExit(f"the first job {status}")
                if DEMO_MODELS <= set(registered) and "demo done" not in marks:
                    marks["demo done"] = now
                if "first job" in marks and (not args.all or "demo done" in marks):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    cores = len(os.sched_getaffinity(0))
    print(f"# explainq up, empty EXPLAINQ_HOME, {cores} cores, load average {os.getloadavg()[0]:.2f} at the end")
    print(f"# first model: {first_model['name'] if first_model else '-'}")
    print("| event | seconds after `explainq up` |")
    print("|---|---|")
    for name in ("api", "first model", "worker", "first job", "demo done"):
        print(f"| {name} | {marks[name]:.1f} |" if name in marks else f"| {name} | - |")


if __name__ == "__main__":
    main()
