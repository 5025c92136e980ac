"""The time the bounded checkpoint load adds to an import job: a tenant's pickled weights read in a child
(models/bounded_load.py: the load, the flat state written and read back) against the same loader in the worker's
process, on state dicts of a few sizes; the child forked by the warm child (the default: torch imported once per
worker) and a fresh Python per load (``EXPLAINQ_WORKER_LOAD_WARM=false``: start and torch's import every time).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/bounded_load.py --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bounded_parser import _median  # noqa: E402  (the median of repeated timings, as the parser's)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes-mib", default="4,64,256")
    args = parser.parse_args()
    import torch

    from models.bounded_load import LoadBounds
    from models.weight_files import load_state_file, load_state_here

    bounds = LoadBounds(1 << 30, 300, 600)
    cold = LoadBounds(1 << 30, 300, 600, warm=False)
    print("| state dict | tensors | in process | warm child | added | fresh Python | added | warm / fresh |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for mib in (int(s) for s in args.sizes_mib.split(",")):
            n = 32
            per = mib * (1 << 20) // 4 // n
            path = Path(tmp) / f"w{mib}.pt"
            torch.save({f"layer{i}.weight": torch.randn(per) for i in range(n)}, path)
            here = _median(lambda p=path: load_state_here(p), args.repeats)
            load_state_file(path, bounds=bounds)  # the warm child started (once per worker) before it is timed
            child = _median(lambda p=path: load_state_file(p, bounds=bounds), args.repeats)
            fresh = _median(lambda p=path: load_state_file(p, bounds=cold), args.repeats)
            print(f"| {mib} MiB fp32 | {n} | {here * 1000:.0f} ms | {child * 1000:.0f} ms | "
                  f"{(child - here) * 1000:.0f} ms | {fresh * 1000:.0f} ms | {(fresh - here) * 1000:.0f} ms | "
                  f"{child / fresh:.2f} |")


if __name__ == "__main__":
    main()
