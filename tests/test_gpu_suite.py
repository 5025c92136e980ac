"""benchmarks/gpu_suite.sh cannot rot: it parses, names every benchmark with ``--device`` (which each benchmark
takes), keeps its wheels folder out of git, its wheel list holds what the suite needs beyond torch and transformers,
and its smoke mode runs every step on the CPU (slow) and writes one results file with every section."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.service import ROOT

SUITE = ROOT / "benchmarks" / "gpu_suite.sh"
WHEELS = ROOT / "benchmarks" / "gpu_wheels.sh"
BENCHMARKS = ("ig.py", "tracin.py", "featurize.py", "bdh.py")
SECTIONS = ("cuda-marked tests", "IG against Captum, fp32 against AMP", "TracIn throughput, fp32 against AMP",
            "TRAK featurize and query (fp32)", "Vision-BDH step time, fp32", "Vision-BDH step time, bf16")


def test_the_scripts_parse_and_say_how_to_use_them():
    for script in (SUITE, WHEELS):
        subprocess.run(["bash", "-n", str(script)], check=True)
    out = subprocess.run(["bash", str(SUITE), "--help"], capture_output=True, text=True, check=True).stdout
    assert "--smoke" in out and "8 minutes" in out
    bad = subprocess.run(["bash", str(SUITE), "--fast"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument --fast" in bad.stderr


def test_every_benchmark_runs_with_the_device_flag_it_takes():
    text = SUITE.read_text()
    for name in BENCHMARKS:
        calls = re.findall(rf"benchmarks/{re.escape(name)}[^\n]*", text)
        assert calls and all('--device "$DEVICE"' in c for c in calls), name
        source = (ROOT / "benchmarks" / name).read_text()
        assert re.search(r"add_argument\(\"--device\"[^)]*\"cuda\"", source), name
    assert 'DEVICE=cuda' in text and 'DEVICE=cpu' in text


def test_the_wheels_folder_is_ignored_and_named_by_both_scripts():
    ignored = (ROOT / ".gitignore").read_text().split()
    assert ".gpu-wheels/" in ignored
    for script in (SUITE, WHEELS):
        assert "$ROOT/.gpu-wheels" in script.read_text()


def test_the_wheel_list_is_what_the_suite_needs_beyond_torch_and_transformers():
    code = WHEELS.read_text().split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    out = subprocess.run([sys.executable, "-", str(ROOT)], input=code, capture_output=True, text=True, check=True)
    pins = dict(line.split("==") for line in out.stdout.split())
    assert {"torch", "transformers", "triton", "tokenizers"}.isdisjoint(pins)
    assert not any(name.startswith("nvidia-") for name in pins)
    assert {"fastapi", "pydantic", "rq", "redis", "numpy", "captum", "pytest", "safetensors"} <= set(pins)
    from importlib import metadata

    assert pins["captum"] == metadata.version("captum")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_smoke_mode_runs_every_step_on_the_cpu(tmp_path):
    env = {**os.environ, "RESULTS_DIR": str(tmp_path), "SUITE_SKIP_INSTALL": "1", "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(SUITE), "--smoke"], env=env, capture_output=True, text=True, timeout=3500)
    (results,) = tmp_path.glob("gpu-suite-*.md")
    text = results.read_text()
    assert run.returncode == 0, text[-4000:]
    assert "smoke run on CPU" in text and "- GPU: none" in text
    for title in SECTIONS:
        assert f"## {title}" in text, title
    assert text.count("took ") == len(SECTIONS) and "stopped after its budget" not in text
    assert "| (c) layers=all" in text or "(c) ghost" in text or "explainq" in text
