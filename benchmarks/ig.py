"""Integrated Gradients on NRMS-MiniLM: the source's loop, two Captum recipes and explainq, side by side.

    python benchmarks/ig.py            # full: 8 samples, 50-title histories, 32 steps, convergence to 2048 steps
    python benchmarks/ig.py --quick    # a small interactive request: 2 samples, 20-title histories, 8 steps
    python benchmarks/ig.py --quick --rounds 9 --sections methods   # the median of 9 rounds per method

Every method attributes the same samples with the same quadrature (Gauss-Legendre), steps and fp32 precision:

- (a) before: the source's loop, one sample, one step, one backward; the history is re-encoded at every step and
  the parameters require grad (the model as loaded for training);
- (b) Captum LayerIntegratedGradients on the model's natural forward (candidate ids + history ids -> score): the
  history is re-encoded for every interpolation step, as a Captum user would write it;
- (c) Captum IntegratedGradients on the candidate embeddings with a cached user vector, all steps in one pass
  (history encoding excluded from its time), on fixed-length inputs: every title padded to the model's
  ``max_title_len`` (30), the tensor shape an NRMS data pipeline (MIND's title length) feeds it;
- (c') the same, with the titles padded only to the longest of these samples (dynamic padding, the best case for
  Captum: with few samples of similar length there is little padding to skip);
- (d) explainq (``models.news.attribution.explain``): frozen parameters, cached user vector (included in its time),
  samples x alphas batched, gradients w.r.t. the inputs only, length bucketing.

Each method runs in its own process so that its peak memory (RSS growth over the loaded model, or CUDA peak
allocation) is its own. In that process it runs ``--rounds`` timed rounds (after one untimed warm-up round for
(c), (c') and (d)); the table gives the median round's wall time and the median round's process CPU time (all
threads; less disturbed than wall time by other load on a shared machine), per sample-step. Then: a convergence table (median/max relative completeness delta against n_steps) and
fp32 against bf16 for explainq.

Why (d) cannot be much faster than (c') in fp32: both spend >80% of their time in the same matmuls (the frozen
MiniLM's forward and input-gradient passes). The script prints the matmul FLOPs per sample-step of (c') and (d)
(``FlopCounterMode``) against a plain sgemm rate measured on the same threads, i.e. the floor for each.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "nrms-minilm-demo"


# ------------------------------------------------------------------------------------------------------ setup
def find_model(home: Path, small_root: Path | None) -> tuple[Path, Path]:
    """(checkpoint dir, dataset dir) of the demo model; builds the small demo when asked and the demo is missing."""
    from core import registry
    from core.settings import Settings

    settings = Settings(EXPLAINQ_HOME=str(home))
    entry = registry.get_model(settings, MODEL)
    ds = registry.get_dataset(settings, "news-synthetic")
    if entry is not None and ds is not None:
        return registry.absolute_path(settings, entry), registry.absolute_path(settings, ds)
    if small_root is None:
        raise SystemExit(f"{MODEL} is not registered under {home}; run `explainq demo --only attributions` "
                         "first, or pass --small DIR to train a small one")
    from models.news.demo import build_small

    paths = build_small(small_root, (MODEL,))
    return paths[MODEL], small_root / "data" / "news-synthetic"


def make_samples(data: Path, n: int, history: int, seed: int = 0) -> list:
    """``n`` balanced test samples whose histories are topped up to ``history`` titles from the user's topics."""
    from models.news.data import load_samples, read_mind

    news = list(read_mind(data / "test").news.values())
    by_title = {x.title: x for x in news}
    samples = load_samples(data, "test", n, balanced=True, seed=seed, max_history=history)
    rng = random.Random(seed)
    for s in samples:
        topics = {by_title[t].category for t in s.history if t in by_title}
        pool = [x.title for x in news if x.category in topics and not x.fake and x.title not in s.history]
        rng.shuffle(pool)
        s.history = (s.history + pool)[:history]
    return samples


def _peak_bytes(device) -> int:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------------------------------------------- methods
def _candidate_inputs(model, samples):
    import torch

    tok = model.tokenizer
    out = []
    for s in samples:
        enc = model.tokenize([s.candidate])["title"]
        special = torch.tensor([[int(i) in tok.special_ids for i in enc.ids[0]]])
        base_ids = torch.where(special, enc.ids, torch.full_like(enc.ids, tok.pad_id))
        out.append((enc.ids.to(model.device), enc.mask.to(model.device), base_ids.to(model.device)))
    return out


def method_before(model, samples, n_steps: int) -> list[np.ndarray]:
    """(a) one sample, one step, one backward; history re-encoded each step; parameters require grad."""
    import torch

    from models.explain.ig import integrated_gradients_reference

    for p in model.parameters():
        p.requires_grad_(True)
    out = []
    for s, (ids, mask, base_ids) in zip(samples, _candidate_inputs(model, samples), strict=True):
        def score(x: torch.Tensor, s=s, mask=mask) -> torch.Tensor:
            h = model.encode_news(model.tokenize(s.history))
            u = model.user_vector(h[None], torch.ones(1, h.shape[0], device=h.device))[0]
            return model.news_from_embeddings({"title": x}, {"title": mask})[0] @ u

        with torch.no_grad():
            x, xb = model.embed("title", ids)[0], model.embed("title", base_ids)[0]
        res = integrated_gradients_reference(score, x, xb, n_steps=n_steps, method="gausslegendre")
        model.zero_grad(set_to_none=True)
        out.append(res.attributions[0].sum(-1).double().cpu().numpy())
    return out


def method_captum_layer(model, samples, n_steps: int, internal_batch_size: int) -> list[np.ndarray]:
    """(b) LayerIntegratedGradients on the candidate's embedding layer of the natural forward."""
    import torch
    from captum.attr import LayerIntegratedGradients
    from torch import nn

    for p in model.parameters():
        p.requires_grad_(True)

    class CandidateEmbedding(nn.Module):
        """The word-embedding layer as seen by the candidate path (the history path calls it directly)."""

        def __init__(self, emb: nn.Module):
            super().__init__()
            self.emb = emb

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.emb(ids)

    cand_layer = CandidateEmbedding(model.token_encoder.bert.embeddings.word_embeddings)

    def natural_forward(cand_ids, cand_mask, hist_ids, hist_mask):
        b = cand_ids.shape[0]
        h = model.news_from_embeddings({"title": model.embed("title", hist_ids.flatten(0, 1))},
                                       {"title": hist_mask.flatten(0, 1)}).view(b, hist_ids.shape[1], -1)
        u = model.user_vector(h, torch.ones(h.shape[:2], device=h.device))
        c = model.news_from_embeddings({"title": cand_layer(cand_ids)}, {"title": cand_mask})
        return (c * u).sum(-1)

    lig = LayerIntegratedGradients(natural_forward, cand_layer)
    out = []
    for s, (ids, mask, base_ids) in zip(samples, _candidate_inputs(model, samples), strict=True):
        hist = model.tokenize(s.history)["title"]
        attr = lig.attribute(ids, baselines=base_ids, n_steps=n_steps, method="gausslegendre",
                             additional_forward_args=(mask, hist.ids[None].to(model.device),
                                                      hist.mask[None].to(model.device)),
                             internal_batch_size=internal_batch_size)
        out.append(attr.sum(-1)[0].double().detach().cpu().numpy())
    return out


def _fixed_length(enc, length: int, pad_id: int):
    """Pad token ids and mask on the right to ``length`` (the titles are already at most that long)."""
    import torch

    extra = length - enc.ids.shape[1]
    if extra <= 0:
        return enc.ids, enc.mask
    return (torch.cat((enc.ids, torch.full((enc.ids.shape[0], extra), pad_id, dtype=enc.ids.dtype)), 1),
            torch.cat((enc.mask, torch.zeros((enc.mask.shape[0], extra), dtype=enc.mask.dtype)), 1))


def method_captum_embeddings(model, samples, n_steps: int, timer: dict, fixed_length: bool,
                             with_delta: bool = False) -> list[np.ndarray]:
    """(c) / (c') IntegratedGradients on padded candidate embeddings, user vector cached (not timed); (c'') asks
    Captum for its convergence delta too (F(x) and F(x'), which explainq always reports)."""
    import torch
    from captum.attr import IntegratedGradients

    from models.news.attribution import user_vectors

    for p in model.parameters():
        p.requires_grad_(True)
    with torch.no_grad():
        users = torch.stack(user_vectors(model, samples))
    timer["start"], timer["cpu_start"] = time.perf_counter(), time.process_time()
    tok = model.tokenizer
    enc = model.tokenize([s.candidate for s in samples])["title"]
    ids, mask = _fixed_length(enc, model.config["max_title_len"], tok.pad_id) if fixed_length else (enc.ids, enc.mask)
    special = torch.tensor([[int(i) in tok.special_ids for i in row] for row in ids.tolist()])
    ids, mask, special = ids.to(model.device), mask.to(model.device), special.to(model.device)
    base_ids = torch.where(special | (mask == 0), ids, torch.full_like(ids, tok.pad_id))
    with torch.no_grad():
        x, xb = model.embed("title", ids), model.embed("title", base_ids)

    def f(e, m, u):
        return (model.news_from_embeddings({"title": e}, {"title": m}) * u).sum(-1)

    attr = IntegratedGradients(f).attribute(x, baselines=xb, additional_forward_args=(mask, users),
                                            n_steps=n_steps, method="gausslegendre",
                                            return_convergence_delta=with_delta)
    if with_delta:
        attr, _ = attr
    attr = attr.sum(-1)
    lengths = enc.mask.sum(1).tolist()
    return [attr[i, : lengths[i]].double().detach().cpu().numpy() for i in range(len(samples))]


def method_explainq(model, samples, n_steps: int, precision: str = "fp32") -> tuple[list[np.ndarray], dict]:
    """(d) explainq's optimized path. The summary gains ``prepare_wall`` and ``prepare_cpu``: the time spent in
    tokenisation and the user vectors (``attribution._prepare``), which (c) and (c') do not time either."""
    from models.news import attribution
    from models.news.attribution import IGOptions, explain

    spent = {"prepare_wall": 0.0, "prepare_cpu": 0.0}
    prepare = attribution._prepare

    def timed_prepare(*a, **kw):  # noqa: ANN002, ANN003
        w, c = time.perf_counter(), time.process_time()
        try:
            return prepare(*a, **kw)
        finally:
            spent["prepare_wall"] += time.perf_counter() - w
            spent["prepare_cpu"] += time.process_time() - c

    attribution._prepare = timed_prepare
    try:
        report = explain(model, samples, IGOptions(n_steps=n_steps, method="gausslegendre", precision=precision))
    finally:
        attribution._prepare = prepare
    by_id = {r["id"]: r for r in report["samples"]}
    return [np.array(by_id[s.id]["token_attributions"]) for s in samples], {**report["summary"], **spent}


def _child(name: str, ckpt: str, data: str, args: dict, queue) -> None:
    import torch

    torch.set_num_threads(args["threads"])
    from models.common import default_device
    from models.news import checkpoint

    device = default_device()
    model = checkpoint.load(Path(ckpt), device).model
    samples = make_samples(Path(data), args["samples"], args["history"])
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    before = _peak_bytes(device)
    # (c), (c') and (d) first run one untimed warm-up round (first-call costs: allocator, kernel selection, and for
    # (d) its per-model caches); (a) and (b) spend seconds per round, so they start timing at once.
    warmup = 0 if name in ("a", "b") else 1
    times, cpu_times = [], []
    for r in range(warmup + args["rounds"]):
        timer: dict[str, float] = {}
        t0, c0 = time.perf_counter(), time.process_time()
        extra: dict[str, Any] = {}
        if name == "a":
            attrs = method_before(model, samples, args["steps"])
        elif name == "b":
            attrs = method_captum_layer(model, samples, args["steps"], args["captum_internal_batch"])
        elif name in ("c", "c2", "c3"):
            attrs = method_captum_embeddings(model, samples, args["steps"], timer, fixed_length=name == "c",
                                             with_delta=name == "c3")
        else:
            attrs, extra = method_explainq(model, samples, args["steps"], args.get("precision", "fp32"))
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - timer.get("start", t0)
        cpu = time.process_time() - timer.get("cpu_start", c0)
        if name == "d":  # like (c), the time excludes tokenisation and the user vectors (reported separately)
            seconds -= extra["prepare_wall"]
            cpu -= extra["prepare_cpu"]
        if r >= warmup:
            times.append(seconds)
            cpu_times.append(cpu)
    queue.put({"name": name, "seconds": float(np.median(times)), "cpu_seconds": float(np.median(cpu_times)),
               "rounds": [round(t, 4) for t in times], "peak_bytes": _peak_bytes(device) - before,
               "attrs": [a.tolist() for a in attrs], "summary": extra, "device": str(device)})


def _max_title_len(ckpt: Path) -> int:
    import json

    from models.news.modules import NRMS_DEFAULTS

    cfg = json.loads((ckpt / "config.json").read_text())
    return int(cfg.get("max_title_len", NRMS_DEFAULTS["max_title_len"]))


def _floor_child(ckpt: str, data: str, args: dict, queue) -> None:
    """Matmul FLOPs per sample-step of (c') and (d), and a plain sgemm rate on the same threads."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from models.common import default_device
    from models.news import checkpoint

    torch.set_num_threads(args["threads"])
    device = default_device()
    model = checkpoint.load(Path(ckpt), device).model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    samples = make_samples(Path(data), args["samples"], args["history"])

    def flops(titles: list[str]) -> int:
        enc = model.tokenize(titles)["title"]
        x = model.embed("title", enc.ids.to(device)).detach().requires_grad_(True)
        with FlopCounterMode(display=False) as counter:
            model.news_from_embeddings({"title": x}, {"title": enc.mask.to(device)}).sum().backward()
        return counter.get_total_flops()

    titles = [s.candidate for s in samples]
    c2 = flops(titles) / len(titles)  # padded to the longest, as (c')
    d = sum(flops([t]) for t in titles) / len(titles)  # each at its own length, as (d)'s exact-length chunks
    a = torch.randn(4096, 384, device=device)
    w = torch.randn(1536, 384, device=device)
    F.linear(a, w)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(10):
            F.linear(a, w)
        best = min(best, time.perf_counter() - t0)
    queue.put({"c2": c2, "d": d, "gflops": 10 * 2 * 4096 * 384 * 1536 / best / 1e9})


def _in_process(what: str, target, *args) -> dict:  # noqa: ANN001
    """Run ``target(*args, queue)`` in a fresh spawned process and return what it put on the queue."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"{what} exited with {proc.exitcode}")
    return result


def matmul_floor(ckpt: Path, data: Path, args: dict) -> dict:
    return _in_process("the matmul floor", _floor_child, str(ckpt), str(data), args)


def run_isolated(name: str, ckpt: Path, data: Path, args: dict) -> dict:
    return _in_process(f"method {name}", _child, name, str(ckpt), str(data), args)


def max_rel_diff(a: list, b: list) -> float:
    return max(float(np.abs(np.array(x) - np.array(y)).max() / np.abs(np.array(y)).max()) for x, y in zip(a, b,
                                                                                                       strict=True))


# --------------------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--history", type=int, default=None,
                        help="titles per user history (default 20 with --quick, else 50)")
    parser.add_argument("--home", default=os.environ.get("EXPLAINQ_HOME", str(ROOT / "var")))
    parser.add_argument("--small", default=None, help="train a small demo model here when the demo is missing")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed rounds per method (and per precision-table cell); the median is reported")
    parser.add_argument("--sections", default="methods,convergence,precision,tolerance",
                        help="comma-separated subset of methods, convergence, precision, tolerance")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="where every method runs (auto: cuda when available); the precision table compares "
                        "fp32 with bf16, and with fp16 on CUDA")
    opts = parser.parse_args()
    if opts.device != "auto":  # read by models.common.default_device here and in every spawned method process
        os.environ["EXPLAINQ_DEVICE"] = opts.device
    sections = set(opts.sections.split(","))
    quick = opts.quick
    history = opts.history if opts.history is not None else (20 if quick else 50)
    if history < 1:
        parser.error("--history must be at least 1")
    args = {"samples": 2 if quick else 8, "history": history, "steps": 8 if quick else 32,
            "threads": opts.threads, "captum_internal_batch": 8, "rounds": opts.rounds}
    ckpt, data = find_model(Path(opts.home), Path(opts.small) if opts.small else None)
    args["max_title_len"] = _max_title_len(ckpt)

    import torch

    torch.set_num_threads(opts.threads)
    from models.common import default_device

    print(f"# IG benchmark: {MODEL}, {args['samples']} samples, {args['history']}-title histories, "
          f"{args['steps']} Gauss-Legendre steps, fp32, {opts.threads} threads, median of {opts.rounds} rounds, "
          f"torch {torch.__version__}, device {default_device()}")
    if "methods" in sections:
        methods_table(ckpt, data, args, opts)
    from models.news import checkpoint

    model = checkpoint.load(ckpt, default_device()).model
    if "convergence" in sections:
        convergence_table(model, data, args, quick)
    if "precision" in sections:
        precision_table(ckpt, data, args)
    if "tolerance" in sections:
        tolerance_table(model, data, args, quick)


def tolerance_table(model, data: Path, args: dict, quick: bool) -> None:
    """Steps and time to reach a completeness tolerance: before (the whole request at 64, 128, ... steps until
    the median relative delta meets it, every level recomputed), Gauss-Legendre refined per sample (levels 16,
    32, 64, ..., each recomputed) and Clenshaw-Curtis refined per sample (levels 16, 31, 61, ..., nested: the
    default with a tolerance). One untimed warm-up request first, so no row pays the process's first call."""
    import time as _time

    from models.news.attribution import IGOptions, explain

    samples = make_samples(data, args["samples"], args["history"], seed=2)
    explain(model, samples, IGOptions(n_steps=8, precision="fp32"))  # warm-up: first call, memory probe
    print()
    print(f"tolerance ({len(samples)} samples, fp32; evaluations = gradient evaluations summed over samples; "
          "before: median criterion, after: every sample; seconds: median of "
          f"{args['rounds']} rounds)")
    print("| tolerance | rule | steps (largest) | gradient evaluations | seconds | median / max rel. delta |")
    print("|---:|---|---:|---:|---:|---:|")

    def before(tol: float) -> tuple[dict, int]:
        n, evaluations = 64, 0
        while True:
            s = explain(model, samples, IGOptions(n_steps=n, method="gausslegendre", precision="fp32"))["summary"]
            evaluations += n * len(samples)
            if s["median_relative_delta"] <= tol or n >= 4096:
                return s, evaluations
            n *= 2

    def after(tol: float, method: str | None) -> tuple[dict, int]:
        s = explain(model, samples, IGOptions(tolerance=tol, method=method, precision="fp32"))["summary"]
        return s, s["gradient_evaluations"]

    rules = (("before: Gauss-Legendre 64, 128, ... recomputed", None),
             ("after: Gauss-Legendre 16, 32, ... per sample", "gausslegendre"),
             ("after: Clenshaw-Curtis 16, 31, 61, ... nested (default)", None))
    for tol in (1e-3, 1e-5):
        for k, (label, method) in enumerate(rules):
            times = []
            for _ in range(max(1, args["rounds"])):
                t0 = _time.perf_counter()
                s, evaluations = before(tol) if k == 0 else after(tol, method)
                times.append(_time.perf_counter() - t0)
            print(f"| {tol:.0e} | {label} | {s['n_steps']} | {evaluations} | {float(np.median(times)):.2f} | "
                  f"{s['median_relative_delta']:.1e} / {s['max_relative_delta']:.1e} |", flush=True)


def methods_table(ckpt: Path, data: Path, args: dict, opts) -> None:  # noqa: ANN001
    results = {}
    for name in ("a", "b", "c", "c2", "c3", "d"):
        results[name] = run_isolated(name, ckpt, data, args)
        print(f"  ran ({name}) in {results[name]['seconds']:.1f}s", flush=True)
    sample_steps = args["samples"] * args["steps"]
    labels = {"a": "(a) before: loop, history re-encoded per step",
              "b": "(b) Captum LayerIG, natural forward",
              "c": f"(c) Captum IG, embeddings, cached user, fixed length {args['max_title_len']}",
              "c2": "(c') the same, padded to the longest sample",
              "c3": "(c'') (c') with its convergence delta (F(x), F(x'))",
              "d": "(d) explainq"}
    d_ms = results["d"]["seconds"] * 1000 / sample_steps
    d_cpu = results["d"]["cpu_seconds"] * 1000 / sample_steps
    print()
    print("| method | wall ms / sample-step | CPU ms / sample-step | wall vs (d) | CPU vs (d) | peak memory MiB | "
          "max rel. diff vs (d) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in ("a", "b", "c", "c2", "c3", "d"):
        r = results[name]
        ms = r["seconds"] * 1000 / sample_steps
        cpu = r["cpu_seconds"] * 1000 / sample_steps
        diff = "-" if name == "d" else f"{max_rel_diff(r['attrs'], results['d']['attrs']):.1e}"
        print(f"| {labels[name]} | {ms:.2f} | {cpu:.2f} | {ms / d_ms:.2f}x | {cpu / d_cpu:.2f}x | "
              f"{r['peak_bytes'] / 2**20:.0f} | {diff} |")
    c_ms = results["c"]["seconds"] * 1000 / sample_steps
    c2_ms = results["c2"]["seconds"] * 1000 / sample_steps
    c2_cpu = results["c2"]["cpu_seconds"] * 1000 / sample_steps
    s_d = results["d"]["summary"]
    print(f"(c), (c') and (d) exclude the user vectors: (d) spent {s_d['prepare_wall']:.2f}s "
          f"({s_d['prepare_cpu']:.2f} CPU-s) on tokenisation and {args['samples']} user vectors "
          f"({args['history']} titles each), once per sample. Rounds (wall s): "
          + "; ".join(f"({k}) {' '.join(f'{t:.3f}' for t in results[k]['rounds'])}" for k in ("c", "c2", "c3", "d")))
    print()
    floor = matmul_floor(ckpt, data, args)
    print(f"matmul FLOPs per sample-step: (c') {floor['c2'] / 1e6:.0f} M, (d) {floor['d'] / 1e6:.0f} M; sgemm on "
          f"{opts.threads} threads {floor['gflops']:.0f} GFLOP/s, so (c') runs its matmuls at "
          f"{floor['c2'] / (c2_ms / 1000) / 1e9:.0f} GFLOP/s ({floor['c2'] / (c2_ms / 1000) / 1e9 / floor['gflops']:.0%} "
          f"of that) and the fp32 floor for (d) is {floor['d'] / floor['gflops'] / 1e6:.2f} ms "
          f"({floor['d'] / floor['gflops'] / 1e6 / c2_ms:.2f}x (c')).")
    print()
    print(f"goals: d <= 0.5 c: {d_ms / c_ms:.2f} -> {'met' if d_ms <= 0.5 * c_ms else 'NOT met'}; "
          f"d <= c' (wall): {d_ms / c2_ms:.2f} -> {'met' if d_ms <= c2_ms else 'NOT met'}; "
          f"d <= c' (CPU): {d_cpu / c2_cpu:.2f} -> {'met' if d_cpu <= c2_cpu else 'NOT met'}; "
          f"d vs c'' (same outputs, wall): {d_ms / (results['c3']['seconds'] * 1000 / sample_steps):.2f}; "
          f"d >= 20x b: {results['b']['seconds'] / results['d']['seconds']:.1f}x -> "
          f"{'met' if results['b']['seconds'] >= 20 * results['d']['seconds'] else 'NOT met'}; "
          f"d >= 20x a: {results['a']['seconds'] / results['d']['seconds']:.1f}x -> "
          f"{'met' if results['a']['seconds'] >= 20 * results['d']['seconds'] else 'NOT met'}")



def convergence_table(model, data: Path, args: dict, quick: bool) -> None:  # noqa: ANN001
    from models.news.attribution import IGOptions, explain

    conv_samples = make_samples(data, 2, args["history"], seed=1)
    steps = [8, 16, 31, 32, 48, 61, 64] if quick else [8, 16, 31, 32, 48, 61, 64, 128, 256, 512, 1024, 2048]
    print()
    print(f"convergence ({len(conv_samples)} samples, fp32): median / max relative completeness delta")
    print("| n_steps | riemann_right | riemann_trapezoid | clenshaw_curtis | gausslegendre |")
    print("|---:|---:|---:|---:|---:|")
    table: dict[tuple[str, int], float] = {}
    for n in steps:
        cells = []
        for method in ("riemann_right", "riemann_trapezoid", "clenshaw_curtis", "gausslegendre"):
            s = explain(model, conv_samples, IGOptions(n_steps=n, method=method, precision="fp32"))["summary"]
            table[(method, n)] = s["median_relative_delta"]
            cells.append(f"{s['median_relative_delta']:.1e} / {s['max_relative_delta']:.1e}")
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
    ref = table[("riemann_right", steps[-1])]
    gl_ok = [n for n in steps if n <= 48 and table[("gausslegendre", n)] <= ref]
    print(f"goal: Gauss-Legendre with <= 48 steps reaches riemann_right-{steps[-1]} ({ref:.1e}): "
          f"{'met at ' + str(min(gl_ok)) + ' steps' if gl_ok else 'NOT met'}")



def precision_table(ckpt: Path, data: Path, args: dict) -> None:
    from models.common import default_device, resolve_precision

    print()
    steps_list = sorted({args["steps"], 64})
    print(f"precision ((d), {args['samples']} samples; auto resolves to {resolve_precision('auto', default_device())} "
          "here)")
    print("| precision | n_steps | ms / sample-step | median / max rel. delta | max rel. diff vs fp32 |")
    print("|---|---:|---:|---:|---:|")
    prec: dict[tuple[str, int], dict] = {}
    halves = ("bf16", "fp16") if default_device().type == "cuda" else ("bf16",)  # fp16 autocast is CUDA's
    for n in steps_list:
        for p in ("fp32", *halves):
            prec[(p, n)] = run_isolated("d", ckpt, data, {**args, "precision": p, "steps": n})
        for p in ("fp32", *halves):
            r = prec[(p, n)]
            ms = r["seconds"] * 1000 / (args["samples"] * n)
            diff = max_rel_diff(r["attrs"], prec[("fp32", n)]["attrs"])
            print(f"| {p} | {n} | {ms:.2f} | {r['summary']['median_relative_delta']:.1e} / "
                  f"{r['summary']['max_relative_delta']:.1e} | {diff:.1e} |", flush=True)
    n = steps_list[-1]
    fp32, bf16 = prec[("fp32", n)], prec[("bf16", n)]
    faster = "bf16" if bf16["seconds"] < fp32["seconds"] else "fp32"
    auto = resolve_precision("auto", default_device())
    worse = bf16["summary"]["median_relative_delta"] / max(fp32["summary"]["median_relative_delta"], 1e-300)
    print(f"faster here: {faster} (bf16 at {fp32['seconds'] / bf16['seconds']:.2f}x fp32's speed); auto picks {auto}. "
          f"At {n} steps bf16's median completeness delta is {worse:.0f}x fp32's: rounding, not quadrature, sets its "
          "floor. On CPU, auto is fp32 for explanations (bf16 autocast is also ~20x slower on AVX2-only CPUs); ask "
          "for bf16 explicitly to trade accuracy for speed.")


if __name__ == "__main__":
    main()
