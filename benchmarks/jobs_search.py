"""Searching one owner's jobs (``GET /jobs?q=&tag=&created_after=``), measured on the job store over a private Redis.

An owner with ``--jobs`` jobs (queued, no workers; every 100th tagged ``rare``, labels all different) is listed a
page of 20 at a time, side by side in one run:

  page            the newest page, no filter
  tag rare        the jobs tagged ``rare`` (1 in 100: the scan reads about 2,000 jobs for 20)
  q miss          a text no job holds: the scan reads up to its limit (5,000 jobs) and returns a cursor
  watch, full     what a watching jobs list would ask every 2 s without ``created_after``: a filter with no new
                  job matching, so the whole scan limit is read
  watch, after    the same with ``created_after`` = the newest job's time: the scan stops there

Each line is the median of ``--repeats`` calls. The ``created_after`` answer is checked element-wise against the
reference (the same listing without it, filtered by ``created_at``) for several cut times.

    python benchmarks/jobs_search.py --jobs 20000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis import Redis  # noqa: E402

from core.contract.kind import load_kinds as load_all  # noqa: E402
from core.jobstore import JobStore  # noqa: E402
from core.jobview import parse_ts  # noqa: E402
from core.redis_server import EmbeddedRedis  # noqa: E402
from core.settings import Settings  # noqa: E402

OWNER = "bench"


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _when(view: dict) -> datetime:
    return datetime.fromtimestamp(parse_ts(view["created_at"]), tz=UTC)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as home:
        server = EmbeddedRedis(Path(home) / "redis", appendonly=False).start()
        try:
            settings = Settings(EXPLAINQ_HOME=home, REDIS_URL=server.url, EXPLAINQ_MAX_ACTIVE_JOBS=10**7,
                                EXPLAINQ_MAX_QUEUE_LENGTH=10**7)
            store = JobStore(Redis.from_url(server.url), settings)
            kind = load_all()["train_conve"]
            t0 = time.perf_counter()
            for i in range(args.jobs):
                store.submit(kind, {"name": f"model-{i}", "dataset": "nations", "epochs": 1,
                                    "label": f"run {i}", "tags": ["rare"] if i % 100 == 0 else ["common"]}, OWNER)
            made = time.perf_counter() - t0
            newest = store.list(OWNER, limit=1)[0][0]
            after = _when(newest)
            rows = [
                ("page", lambda: store.list(OWNER, limit=20)),
                ("tag rare", lambda: store.list(OWNER, limit=20, tags=("rare",))),
                ("q miss", lambda: store.list(OWNER, limit=20, q="no such text")),
                ("watch, full", lambda: store.list(OWNER, limit=20, q="no such text")),
                ("watch, after", lambda: store.list(OWNER, limit=20, q="no such text", created_after=after)),
            ]
            results = {name: _median_ms(fn, args.repeats) for name, fn in rows}
            # the created_after path against the reference, element-wise, at several cut times
            everything = []
            cursor = None
            while True:
                page, cursor = store.list(OWNER, limit=500, cursor=cursor, scan_limit=10**7)
                everything += page
                if cursor is None:
                    break
            for cut in (everything[0], everything[len(everything) // 3], everything[-1]):
                when = _when(cut)
                fast = [v["id"] for v in store.list(OWNER, limit=10**5, created_after=when, scan_limit=10**7)[0]]
                reference = [v["id"] for v in everything if _when(v) > when]
                assert fast == reference, ("created_after disagrees with the reference", cut["id"])
        finally:
            server.stop()
    print(f"{args.jobs:,} jobs of one owner (submitted in {made:.1f} s); median of {args.repeats} calls, 20 per page")
    print()
    print("| listing | ms |")
    print("|---|---:|")
    for name, ms in results.items():
        print(f"| {name} | {ms:.2f} |")
    print()
    print(f"watch, full / watch, after: {results['watch, full'] / results['watch, after']:.0f}x; created_after "
          "agrees element-wise with the reference at 3 cut times")


if __name__ == "__main__":
    main()
