"""The API-level fairness benchmark's parts run (benchmarks/fairness.py --api; the run itself is minutes)."""

from __future__ import annotations

import os

from benchmarks import fairness
from tests.service import api_client


def test_percentile_median_and_the_table() -> None:
    assert fairness.percentile([3.0, 1.0, 2.0, 4.0], 95) == 4.0
    assert fairness.percentile([float(i) for i in range(1, 21)], 95) == 19.0
    rows = fairness.api_table({"GET /jobs": [0.010, 0.012, 0.020]}, {"GET /jobs": [0.012, 0.013, 0.024]})
    assert rows[2] == "| GET /jobs | 12.0 | 20.0 | 13.0 | 24.0 | 1.08x | 1.20x | <= 1.5x (met) |"
    rows = fairness.api_table({"x": [0.01]}, {"x": [0.02]})
    assert rows[2].endswith("| 2.00x | 2.00x | <= 1.5x (NOT met) |")
    assert fairness._counts([422, 201, 422, 0]) == "cut off x1, 201 x1, 422 x2"


def test_the_files_of_tenant_a(tmp_path) -> None:
    n = fairness.write_triples(tmp_path / "kg" / "train.txt", 1)
    lines = (tmp_path / "kg" / "train.txt").read_bytes().splitlines()
    assert len(lines) == n >= 10_000 and lines[0] == b"e0\tr0\te1"
    size = fairness.write_crafted_import(tmp_path / "pt", entries=1000, copies=10)
    assert size == (tmp_path / "pt" / "model.pt").stat().st_size
    assert {p.name for p in (tmp_path / "pt").iterdir()} == {"model.pt", "train.txt", "config.json"}


def test_a_round_of_b_is_timed_and_the_peak_is_read(tmp_path) -> None:
    assert fairness.status_kib(os.getpid(), "VmHWM") > 0
    with api_client(tmp_path, EXPLAINQ_API_KEYS="b:key-b") as client:
        client.headers.update(fairness.BOB)
        times: dict[str, list[float]] = {}
        busy, overlapped = fairness.InFlight(), []
        with busy:
            fairness.b_round(client, [("jobs", "GET", "/jobs?limit=20", None), ("health", "GET", "/health", None)],
                             times, busy, overlapped)
        assert list(times) == ["jobs", "health"] and all(len(v) == 1 and v[0] > 0 for v in times.values())
        assert overlapped == [True, True]
