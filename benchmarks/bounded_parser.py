"""The latency the bounded parser adds to a submission: each read of a user file in a child (core/bounded.py)
against the same reader in this process, on a small triples directory and a ConvE import's headers.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/bounded_parser.py --repeats 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    from core.bounded import run_bounded
    from core.dataset_formats import detect
    from core.kinds.import_model import ImportModelRequest, _conve_header_check
    from core.settings import Settings
    from core.userfiles import UserFiles

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        kg = data / "kg"
        kg.mkdir(parents=True)
        (kg / "train.txt").write_text("".join(f"e{i}\tr{i % 5}\te{i + 1}\n" for i in range(1000)))
        (kg / "config.json").write_text(json.dumps({"embedding_dim": 20, "embedding_height": 4}))
        header = json.dumps({"ent.weight": {"dtype": "F32", "shape": [10, 20], "data_offsets": [0, 800]}}).encode()
        (kg / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 800)
        settings = Settings(EXPLAINQ_HOME=tmp, EXPLAINQ_DATA_ROOTS=str(data))
        request = {"kind": "conve", "name": "m", "path": "kg", "weights": "model.safetensors",
                   "checkpoints": [{"file": "model.safetensors", "lr": 0.01}]}
        rows = [
            ("dataset.detect (1,000 triples)",
             lambda: detect(kg, UserFiles(settings)),
             lambda: run_bounded(settings, "dataset.detect", {"path": str(kg)}, loc=("body",))),
            ("import.conve_headers (safetensors)",
             lambda: _conve_header_check(ImportModelRequest.model_validate(request), kg, UserFiles(settings)),
             lambda: run_bounded(settings, "import.conve_headers", {"request": request, "directory": str(kg)},
                                 loc=("body",))),
        ]
        print("| read | in process (ms) | bounded child (ms) | added (ms) |")
        print("|---|---|---|---|")
        for name, inline, bounded in rows:
            a, b = _median(inline, args.repeats), _median(bounded, args.repeats)
            print(f"| {name} | {a * 1e3:.1f} | {b * 1e3:.0f} | {(b - a) * 1e3:.0f} |")


if __name__ == "__main__":
    main()
