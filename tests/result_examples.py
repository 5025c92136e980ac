"""An example of any result model, built from its fields (every field filled, optional ones too), valid against
the model: what the SDK's and the dashboard's tests feed their renderers to check that they draw every kind's one
result shape, whether or not a test of that kind's pipeline runs."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from pydantic import BaseModel

# Per-epoch rows that draw as curves (a training result's ``history``); other free-form objects get one key.
HISTORY = [{"epoch": 1, "loss": 0.9, "train_loss": 0.9, "val_accuracy": 0.5},
           {"epoch": 2, "loss": 0.5, "train_loss": 0.5, "val_accuracy": 0.75}]


def _value(annotation: Any, name: str, depth: int) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return None
    if origin is Literal:
        return args[0]
    if origin in (typing.Union, types.UnionType):
        return _value(next(a for a in args if a is not type(None)), name, depth)
    if origin is typing.Annotated:
        return _value(args[0], name, depth)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return example(annotation, depth + 1)
    if origin in (list, typing.Sequence):
        if name == "history" and args and typing.get_origin(args[0]) is dict:
            return [dict(r) for r in HISTORY]
        return [_value(args[0] if args else str, name, depth)] if depth < 6 else []
    if origin is tuple:
        return [_value(a, name, depth) for a in args if a is not Ellipsis]
    if origin is dict:
        key = _value(args[0], name, depth) if args else "a"
        return {key if isinstance(key, str) else "a": _value(args[1] if args else str, name, depth)}
    if annotation is bool:
        return True
    if annotation is int:
        return 2
    if annotation is float:
        return 0.5
    if annotation is str:
        return name
    return name  # Any


def example(model: type[BaseModel], depth: int = 0) -> dict[str, Any]:
    """A JSON object valid against ``model`` with every field filled (by field name)."""
    data = {name: _value(info.annotation, name, depth) for name, info in model.model_fields.items()}
    return model.model_validate(data).model_dump(mode="json")


def as_run(result: dict[str, Any], model: type[BaseModel], sharded: bool) -> dict[str, Any]:
    """``result`` as a run writes it: each list the result holds in part named in ``listed`` (the whole list inline
    for a small run; 500 entries in all for a sharded one, which sets ``shards``)."""
    out = dict(result)
    if "shards" in model.model_fields:
        out["shards"] = {"total": 4, "failed": []} if sharded else None
    if "listed" in model.model_fields:
        out["listed"] = {name: {"total": 500 if sharded else len(out[name]), "inline": len(out[name]),
                                "artifact": f"{name}.jsonl"}
                         for name in ("results", "ranking", "samples", "errors") if isinstance(out.get(name), list)}
    return model.model_validate(out).model_dump(mode="json")
