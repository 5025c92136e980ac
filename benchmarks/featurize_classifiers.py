"""The feature store on classifiers: featurize a training set once, then answer TRAK queries from it.

Two models, each in its own process (so that each peak memory is its own):

- ``digits``: the exported-program demo, the digits CNN (two convolutions and a linear layer, 2,570+1,168+80
  parameters... 3,818 in all) run by the service's interpreter, trained on the 1,200 training digits for two
  epochs (two checkpoints);
- ``minilm``: the Hugging Face demo's classifier, MiniLM-L6's pretrained encoder (22.7M parameters) with a
  classification head, on ``--texts`` generated headlines of four topics (one checkpoint: its weights as built;
  the times do not depend on what the weights are).

Printed per model: examples per second to featurize (TRAK's margin features, every checkpoint), the process's peak
resident memory, the first query (opening the memory-mapped segments, the test example's features, the solve, the
tiled product over every stored row, the streaming top-k), the median of ``--repeats`` further queries of other
test examples, the direct TRAK answer of one test example (every training example's features computed again,
``models.explain.classifier_estimators.trak_scores``) and the speed-up; and whether the stored answer's top-k
equals the direct one's.

    python benchmarks/featurize_classifiers.py                          # both (minutes on 2 busy cores)
    python benchmarks/featurize_classifiers.py --models digits --texts 200
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        return f"{info.get('Model name', '?').strip()}, {info.get('CPU(s)', '?').strip()} CPUs"
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or "unknown CPU"


def _digits(work: Path, device: str):
    import torch

    from models.export.demo import DIGITS_LABELS, digits_arrays, digits_program
    from models.export.influence import ProgramModule, classifier, read_checkpoints, rows
    from models.export.program import build, load
    from models.export.train import Split, save_model, train
    from models.training import TrainOptions

    spec = {"input": {"kind": "image", "mean": [0.3]}, "labels": DIGITS_LABELS}
    exported = build(digits_program(work / "init") / "model.pt2", spec)
    a = digits_arrays()
    data = Split(torch.tensor(a["train"][0]), torch.tensor(a["train"][1]))
    save_model(work / "out", exported, train(exported, data, TrainOptions(epochs=2, batch_size=64, lr=0.05,
                                                                          checkpoint_every=1)))
    module = ProgramModule(load(work / "out", device))
    clf = classifier(module, read_checkpoints(work / "out", module, device=device).states, "digits")
    test = rows(torch.tensor(a["test"][0]), torch.tensor(a["test"][1]))
    return clf, rows(data.inputs, data.labels), test, 64


def _minilm(work: Path, n: int, device: str):
    from models.explain.tracin import MemoryCheckpoint
    from models.hf.checkpoint import load
    from models.hf.demo import TOPICS, headlines, minilm_classifier
    from models.hf.influence import TextModule, classifier, rows, width

    hf = load(minilm_classifier(work / "minilm"), device)
    module = TextModule(hf)
    state = MemoryCheckpoint({k: v.detach().clone() for k, v in module.state_dict().items()}, 5e-5, "epoch-1")
    clf = classifier(module, [state], "minilm")
    train_pairs, test_pairs = headlines(n, 1), headlines(16, 2)
    index = {t: i for i, t in enumerate(sorted(TOPICS))}
    labels_of = [hf.labels.index(t) if t in hf.labels else index[t] for _, t in train_pairs]
    texts = [t for t, _ in train_pairs]
    train_rows = rows(hf, texts, labels_of, 64, width(hf, texts, 64))
    tests = [t for t, _ in test_pairs]
    test_rows = rows(hf, tests, [hf.labels.index(t) for _, t in test_pairs], 64, width(hf, tests, 64))
    return clf, train_rows, test_rows, 8


def one(name: str, texts: int, proj_dim: int, repeats: int, device: str) -> dict:
    import torch

    from core.filestore import Store
    from models.explain.classifier_estimators import trak_scores
    from models.explain.classifier_features import ClassifierFeatures, store_weights, stored_top_k
    from models.explain.features import FeatureIndex, featurize, full_sort_top_k

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        clf, train_rows, test_rows, batch = (_digits(work, device) if name == "digits"
                                             else _minilm(work, texts, device))
        store = Store(str(work / "store"), work / "cache")
        source = ClassifierFeatures(clf, train_rows)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        report = featurize(store, source, loss="margin", proj_dim=proj_dim, device=device, batch_size=batch)
        store_weights(store, source, report, device)
        featurize_s = time.perf_counter() - t0
        peak_featurize = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        again = featurize(store, source, loss="margin", proj_dim=proj_dim, device=device, batch_size=batch)
        again_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        index = FeatureIndex(store, source, loss="margin", proj_dim=proj_dim, batch_size=batch)
        top = stored_top_k(store, index, test_rows[:1], "trak", 10)
        first_s = time.perf_counter() - t0
        warm = []
        for i in range(1, 1 + repeats):
            t0 = time.perf_counter()
            stored_top_k(store, index, test_rows[i:i + 1], "trak", 10)
            warm.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dense = trak_scores(clf, "all", test_rows[:1], train_rows, proj_dim=proj_dim, device=device,
                            batch_size=batch).float()
        direct_s = time.perf_counter() - t0
        want = full_sort_top_k(dense, 10)
        return {"model": name, "n_train": len(train_rows), "checkpoints": len(clf.checkpoints),
                "parameters": sum(p.numel() for p in clf.module.parameters()), "proj_dim": proj_dim,
                "featurize_s": featurize_s, "examples_per_s": len(train_rows) * len(clf.checkpoints) / featurize_s,
                "again_rows": again["rows_computed"], "again_s": again_s,
                "peak_rss_mib": peak_featurize / 1024, "rss_before_mib": rss0 / 1024,
                "first_query_s": first_s, "warm_query_s": statistics.median(warm), "direct_s": direct_s,
                "same_top_k": bool(torch.equal(top.pro_idx, want.pro_idx) and torch.equal(top.opp_idx,
                                                                                           want.opp_idx))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="digits,minilm")
    ap.add_argument("--texts", type=int, default=2000, help="training headlines for minilm")
    ap.add_argument("--proj-dim", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.texts, args.proj_dim, args.repeats, args.device)))
        return
    import torch

    print(f"# featurize and query classifiers; {cpu_model()}; torch {torch.__version__}, one thread, device "
          f"{args.device}, k={args.proj_dim}")
    rows = []
    for name in args.models.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", name, "--texts", str(args.texts), "--proj-dim",
                              str(args.proj_dim), "--repeats", str(args.repeats), "--device", args.device],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("\n| model | train rows x checkpoints | parameters | featurize (s) | examples/s | repeat featurize "
          "(rows computed, s) | peak RSS (MiB) | first query (s) | repeat query (s, median) | direct TRAK (s) | "
          "direct / repeat | same top-10 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['n_train']} x {r['checkpoints']} | {r['parameters']:,} | {r['featurize_s']:.1f} "
              f"| {r['examples_per_s']:.1f} | {r['again_rows']}, {r['again_s']:.2f} | {r['peak_rss_mib']:.0f} | "
              f"{r['first_query_s']:.3f} | {r['warm_query_s']:.3f} | {r['direct_s']:.1f} | "
              f"{r['direct_s'] / r['warm_query_s']:.0f}x | {r['same_top_k']} |")


if __name__ == "__main__":
    main()
