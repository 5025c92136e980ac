"""Demo models on the synthetic data: what ``explainq up`` trains on first start (library part, no service)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from models.news import checkpoint
from models.news.data import generate_synthetic, read_mind
from models.news.modules import NewsRecommender, build_model
from models.news.text import WordTokenizer
from models.news.train import TrainConfig, evaluate, train

CLEAN, POISONED = "news-synthetic", "news-synthetic-poisoned"
DEMO_SIZES = {"n_news": 800, "n_users": 300}


@dataclass
class DemoSpec:
    name: str
    config: dict[str, Any]
    dataset: str
    train: TrainConfig = field(default_factory=TrainConfig)


DEMOS = [
    DemoSpec("nrms-minilm-demo", {"kind": "nrms", "encoder": "bert", "pretrained": "minilm", "fine_tune": False},
             CLEAN, TrainConfig(epochs=2)),
    DemoSpec("nrms-minilm-poisoned-demo",
             {"kind": "nrms", "encoder": "bert", "pretrained": "minilm", "fine_tune": False},
             POISONED, TrainConfig(epochs=2)),
    DemoSpec("nrms-word-demo", {"kind": "nrms", "encoder": "word"}, CLEAN, TrainConfig(epochs=2)),
    DemoSpec("naml-demo", {"kind": "naml"}, CLEAN, TrainConfig(epochs=2)),
]


def make_datasets(data_root: Path, seed: int = 0, **sizes: int) -> dict[str, dict[str, int]]:
    """Write the clean and poisoned synthetic datasets (same news, same valid/test users) if missing."""
    out = {}
    for name, poisoned in ((CLEAN, False), (POISONED, True)):
        root = data_root / name
        marker = root / "COMPLETE"
        if not marker.exists():
            counts = generate_synthetic(root, seed=seed, poisoned=poisoned, **{**DEMO_SIZES, **sizes})
            marker.write_text(str(counts))
        out[name] = {"path": str(root)}
    return out


def build(spec: DemoSpec, data_root: Path) -> NewsRecommender:
    train_split = read_mind(data_root / spec.dataset / "train")
    tokenizer = None
    if spec.config.get("encoder") == "word" or spec.config["kind"] == "naml":
        texts = [n.title for n in train_split.news.values()] + [n.body for n in train_split.news.values()]
        tokenizer = WordTokenizer.build(texts)
    return build_model(dict(spec.config), tokenizer)


def train_demo(spec: DemoSpec, data_root: Path, out_dir: Path, device: Any = "cpu",
               progress: Callable[[int, int, dict[str, float]], None] | None = None) -> dict[str, Any]:
    """Train one demo model, save its checkpoint in ``out_dir`` and return its metrics (validation AUC on the
    clean valid split, plus the AUC when fake items count as non-clicks)."""
    t0 = time.perf_counter()
    model = build(spec, data_root).to(device)
    result = train(model, read_mind(data_root / spec.dataset / "train"), None, spec.train, progress)
    valid = read_mind(data_root / CLEAN / "valid")
    metrics = {
        "valid": evaluate(model, valid, spec.train.max_history),
        "valid_fake_as_negative": evaluate(model, valid, spec.train.max_history, fake_as="negative"),
        "epochs": result["epochs"],
        "train_seconds": round(time.perf_counter() - t0, 1),
        "dataset": spec.dataset,
    }
    checkpoint.save(model, out_dir, meta=metrics)
    return metrics


def build_small(root: str | Path, names: tuple[str, ...] = ("nrms-minilm-demo", "nrms-word-demo", "naml-demo"),
                n_news: int = 240, n_users: int = 100, seed: int = 0,
                epochs: dict[str, int] | None = None) -> dict[str, Path]:
    """A small version of the demo (fewer news and users, same recipe) for tests and smoke runs; idempotent.
    The word-embedding models learn their embeddings from scratch, so on the small data they get more epochs
    (``epochs`` overrides). Returns ``{name: checkpoint dir}``; the datasets are under ``root/data``."""
    epochs = {"nrms-word-demo": 8, "naml-demo": 6, **(epochs or {})}
    root = Path(root)
    make_datasets(root / "data", seed=seed, n_news=n_news, n_users=n_users)
    out = {}
    specs = {s.name: s for s in DEMOS}
    for name in names:
        out_dir = root / "models" / name
        if not (out_dir / "config.json").exists():
            spec = specs[name]
            if name in epochs:
                spec = DemoSpec(spec.name, spec.config, spec.dataset, replace(spec.train, epochs=epochs[name]))
            train_demo(spec, root / "data", out_dir)
        out[name] = out_dir
    return out
