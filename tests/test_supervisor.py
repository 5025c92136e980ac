"""`explainq up`'s supervision: exponential restart backoff, why a process died, the CPU split."""

from __future__ import annotations

import argparse
import logging
import sys
import time

import pytest

from explainq.cli import TRAIN_NICE, WORKER_NICE, Restarts, Supervisor, exit_reason, split_threads


class CrashingSupervisor(Supervisor):
    """Supervises 'workers' that die at once: one exits with code 3, one kills itself with SIGKILL."""

    COMMANDS = {
        "worker:explain": [sys.executable, "-c", "import sys; sys.exit(3)"],
        "worker:train": [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
    }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.spawned: dict[str, list[float]] = {}

    def argv(self, name: str) -> list[str]:
        return self.COMMANDS[name]

    def _spawn(self, name: str) -> None:
        self.spawned.setdefault(name, []).append(time.monotonic())
        super()._spawn(name)


@pytest.mark.slow
def test_a_worker_that_dies_at_once_is_restarted_with_exponential_backoff(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("EXPLAINQ_HOME", str(tmp_path))
    args = argparse.Namespace(queues="explain,train", host="127.0.0.1", port=0, no_demo=True, grace_s=5.0)
    sup = CrashingSupervisor(args, backoff_s=0.2, backoff_cap_s=0.8, healthy_s=60)
    caplog.set_level(logging.INFO, logger="explainq")
    for name in sup.COMMANDS:
        sup._spawn(name)
    # Until each command was restarted five times (however slowly a loaded machine starts a process).
    deadline = time.monotonic() + 120
    while any(len(sup.spawned.get(name, ())) < 6 for name in sup.COMMANDS):
        assert time.monotonic() < deadline, sup.spawned
        sup.check()
        time.sleep(0.02)
    sup.stop()
    sup.shutdown()
    for name, times in sup.spawned.items():
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        # Each gap is the process's short life plus the backoff: 0.2, 0.4, 0.8, then capped at 0.8 s. Never
        # shorter (no tight restart loop); the process's life on a loaded machine bounds how much longer.
        for gap, delay in zip(gaps, [0.2, 0.4] + [0.8] * len(gaps), strict=False):
            assert delay <= gap < delay + 10, (name, gaps)
    text = caplog.text
    assert "worker:explain died (exit code 3)" in text
    assert "worker:train died (signal SIGKILL)" in text
    assert "restarting it in 0.8 s" in text


def test_backoff_resets_after_a_healthy_minute():
    r = Restarts(initial=1, cap=60, healthy_s=60)
    assert [r.next_delay(ran_s=0.1) for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert r.next_delay(ran_s=61) == 1 and r.next_delay(ran_s=5) == 2


def test_exit_reasons():
    assert exit_reason(0) == "exit code 0" and exit_reason(3) == "exit code 3"
    assert exit_reason(-9) == "signal SIGKILL" and exit_reason(-15) == "signal SIGTERM"


def test_cores_are_split_between_interactive_and_training_workers():
    w = WORKER_NICE
    assert 0 < w < TRAIN_NICE  # every worker below the API; training below the interactive workers
    assert split_threads(["explain", "train"], 16) == {"explain": (16, w), "train": (8, TRAIN_NICE)}
    assert split_threads(["explain", "train"], 2) == {"explain": (2, w), "train": (1, TRAIN_NICE)}
    assert split_threads(["explain", "explain,train", "train"], 8) == {
        "explain": (4, w), "explain,train": (4, w), "train": (4, TRAIN_NICE)}
    assert split_threads(["train"], 4) == {"train": (4, w)}
    assert split_threads(["explain,train"], 1) == {"explain,train": (1, w)}
