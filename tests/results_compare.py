"""Comparing two results field by field: the check behind "one shape whether a job ran whole or as shards".

``differences(got, want, tolerance, skip)`` lists every place two JSON values differ: keys at every level, types,
list lengths, strings, integers and booleans exactly, floats within ``tolerance(where)`` (``(rtol, atol)`` for the
dotted path of the field), fields named in ``skip`` (at any depth) only present in both; ``assert_same`` also skips
``provenance`` (a run's own: its job, worker and times). ``assert_renders`` checks
that the SDK (HTML and text) and ``explainq-client result --table`` draw the results of real jobs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

Tolerance = Callable[[str], tuple[float, float]]
PER_RUN = ("provenance",)  # what differs between two runs of one request: the job, the worker, the times


def differences(got: Any, want: Any, tolerance: Tolerance, skip: Collection[str] = (),
                where: str = "result") -> list[str]:
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [f"{where}: keys {sorted(got) if isinstance(got, dict) else type(got)} != {sorted(want)}"]
        return [d for k in want if k not in skip
                for d in differences(got[k], want[k], tolerance, skip, f"{where}.{k}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: {len(got) if isinstance(got, list) else type(got)} entries != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in differences(g, w, tolerance, skip, f"{where}[{i}]")]
    if isinstance(want, float) and isinstance(got, float | int) and not isinstance(got, bool):
        rtol, atol = tolerance(where)
        ok = math.isclose(got, want, rel_tol=rtol, abs_tol=atol)
        return [] if ok else [f"{where}: {got!r} != {want!r} (rtol {rtol}, atol {atol})"]
    if isinstance(want, int) and isinstance(got, float) and not isinstance(want, bool):
        return differences(got, float(want), tolerance, skip, where)
    return [] if got == want and type(got) is type(want) else [f"{where}: {got!r} != {want!r}"]


def assert_same(got: Any, want: Any, tolerance: Tolerance, skip: Collection[str] = (),
                where: str = "result") -> None:
    diffs = differences(got, want, tolerance, {*skip, *PER_RUN}, where)
    assert not diffs, f"{len(diffs)} differences:\n" + "\n".join(diffs[:30])


def assert_renders(settings: Any, job_ids: Collection[str], result_class: type, api_key: str | None = None) -> None:
    """The SDK's renderers (HTML and text) and ``explainq-client result --table`` draw each job's result, fetched
    over HTTP from a server on ``settings`` (as ``api_key``'s owner), as a ``result_class``."""
    from explainq_client import Client
    from explainq_client.cli import run as cli

    from tests.http_server import HttpServer

    key = ["--api-key", api_key] if api_key else []
    with HttpServer(settings) as server, Client(server.url, api_key) as client:
        for job_id in job_ids:
            result = client.jobs.get(job_id).result()
            assert isinstance(result, result_class) and result.validated
            assert "<table" in result._repr_html_() and result.text().strip()
            assert cli(["--url", server.url, *key, "result", job_id, "--table"]) == 0
