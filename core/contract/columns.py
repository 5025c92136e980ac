"""The jobs list's ``model`` and ``input`` columns of a request, from the fields kinds name alike."""

from __future__ import annotations

from typing import Any

# ---- what the jobs list shows of a request: the model and a short summary of the input
INPUT_SUMMARY_LENGTH = 120


def _clip(text: str, n: int = INPUT_SUMMARY_LENGTH) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def job_columns(payload: dict[str, Any]) -> dict[str, str]:
    """The jobs list's ``model`` and ``input`` of a request (``{}`` entries left out), from the fields every kind
    names alike: the model a job reads (``model``) or the one it registers (``name``, ``register_as``); the
    samples, triples, dataset or path it reads. Bounded to ``INPUT_SUMMARY_LENGTH`` characters each."""
    out: dict[str, str] = {}
    model = payload.get("model")
    if isinstance(model, str):
        out["model"] = model
        if isinstance(payload.get("compare_with"), str):
            out["model"] += f" vs {payload['compare_with']}"
    else:
        name = payload.get("name") if isinstance(payload.get("name"), str) else payload.get("register_as")
        if isinstance(name, str):
            out["model"] = f"→ {name}"
    parts: list[str] = []
    samples = payload.get("samples")
    if isinstance(samples, list) and samples:
        first = samples[0].get("candidate") if isinstance(samples[0], dict) else None
        parts.append(_plural(len(samples), "sample") + (f": “{first}”" if first else ""))
    triples = payload.get("test_triples")
    if isinstance(triples, list) and triples:
        first = triples[0] if isinstance(triples[0], list) else []
        parts.append(_plural(len(triples), "triple") + (": " + " · ".join(map(str, first)) if first else ""))
    dataset = payload.get("dataset")
    if isinstance(dataset, dict) and isinstance(dataset.get("name"), str):
        parts.append(f"{dataset['name']} ({dataset.get('split', 'test')}, {dataset.get('n_samples', '?')})")
    elif isinstance(dataset, str):
        parts.append(dataset)
    for key in ("test_triples_path", "path"):
        if isinstance(payload.get(key), str):
            parts.append(payload[key])
    if not parts and payload.get("mode") == "self":
        parts.append("self-influence")
    if parts:
        out["input"] = "; ".join(parts)
    return {k: _clip(v) for k, v in out.items()}


