"""How `explainq api` serves the app, and the hot routes' cheap paths (auth lookup, submission script)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from tests.service import ROOT


def test_explainq_api_serves_the_tuned_app_with_uvloop_and_httptools(monkeypatch, tmp_path):
    import uvicorn

    from app import cli

    monkeypatch.setenv("EXPLAINQ_HOME", str(tmp_path))
    monkeypatch.setenv("EXPLAINQ_API_KEYS", "")
    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    cli.cmd_api(argparse.Namespace(host="127.0.0.1", port=8123, workers=1, no_access_log=False))
    (app, kw), = calls
    assert app == "app.main:served_app" and kw["factory"] is True
    assert (kw["loop"], kw["http"]) == ("uvloop", "httptools") == cli.server_implementations()
    assert kw["log_config"] is None and kw["access_log"] is True and kw["log_level"] == "info"


def test_served_app_freezes_the_startup_objects_and_raises_the_first_gc_threshold():
    # In a child process: freezing this test process's objects would outlive the test.
    code = ("import gc, app.main as m; before = gc.get_threshold(); a = m.served_app(); "
            "assert a is m.app, a; assert gc.get_freeze_count() > 10000, gc.get_freeze_count(); "
            "assert gc.get_threshold() == (m.GC_GEN0_THRESHOLD, *before[1:]), gc.get_threshold()")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "EXPLAINQ_API_KEYS": ""})
    assert r.returncode == 0, r.stderr
