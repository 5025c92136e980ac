"""A job reads its request, never a second copy of the request's defaults.

The runner hands a job function its kind's validated request object, so every default lives in the request
model. A job module that reads a field with a fallback (``payload.get("ensemble", 0)``, ``getattr(request,
"ensemble", 0)``) restates a default, and the two drift apart: this test names every such read of a field that
a kind's request declares, in the job modules of every kind (its function, shard and reduce modules).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from pydantic import BaseModel

from core.contract.kind import load_kinds

ROOT = Path(__file__).resolve().parent.parent


def _fields(model: type[BaseModel], seen: set[type] | None = None) -> set[str]:
    """Every field name of a request model and of the models nested in it."""
    seen = set() if seen is None else seen
    if model in seen:
        return set()
    seen.add(model)
    out = set(model.model_fields)
    for field in model.model_fields.values():
        for arg in _models_in(field.annotation):
            out |= _fields(arg, seen)
    return out


def _models_in(annotation: object) -> list[type[BaseModel]]:
    found, stack = [], [annotation]
    while stack:
        item = stack.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            found.append(item)
        stack.extend(getattr(item, "__args__", ()) or ())
    return found


def _module_file(dotted: str) -> Path | None:
    module = dotted.partition(":")[0]
    spec = importlib.util.find_spec(module)
    return Path(spec.origin) if spec is not None and spec.origin else None


def defaulted_reads(path: Path, fields: set[str]) -> list[str]:
    """``x.get("<field>", default)`` and ``getattr(x, "<field>", default)`` calls in ``path`` for a field in
    ``fields``, as ``file:line: text``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = None
        if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2:
            key = node.args[0]
            name = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
        elif isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 3:
            key = node.args[1]
            name = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
        if name in fields:
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def _job_modules() -> dict[Path, set[str]]:
    """Each job module of the product's kinds and plugins under the tree, with the request fields of the kinds it
    serves (a module serving several kinds is checked against all their fields)."""
    out: dict[Path, set[str]] = {}
    for kind in load_kinds().values():
        path = _module_file(kind.func)
        if path is None or ROOT not in path.parents:
            continue
        request = kind.request
        inner = request.model_fields.get("request")
        if inner is not None:  # a shard or reduce step: the parent's request is what it reads
            request = _models_in(inner.annotation)[0]
        out.setdefault(path, set()).update(_fields(request))
    return out


JOB_MODULES = _job_modules()


def test_the_job_modules_are_found() -> None:
    names = {p.name for p in JOB_MODULES}
    assert {"tracin.py", "attributions.py", "evaluate.py", "train_conve.py", "train_bdh.py", "train_news.py",
            "ablations.py", "featurize.py", "import_model.py"} <= names


@pytest.mark.parametrize("path", sorted(JOB_MODULES), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_job_module_restates_a_default_of_its_request(path: Path) -> None:
    assert defaulted_reads(path, JOB_MODULES[path]) == []


def test_the_check_sees_a_restated_default() -> None:
    """The check itself: the read the issue found (``ensemble`` with default 0, the schema saying 4) is named;
    attribute reads and ``.get`` of an unrelated key are not."""
    sample = ROOT / "tests" / "_restated_default_sample.py"
    sample.write_text("def run(request, payload, meta):\n"
                      "    k = payload.get('ensemble', 0)\n"
                      "    j = getattr(request, 'seed', 0)\n"
                      "    ok = request.ensemble + meta.get('fanout', {}).get('shards', 0)\n")
    try:
        found = defaulted_reads(sample, {"ensemble", "seed", "m"})
    finally:
        sample.unlink()
    assert [f.split(": ", 1)[1] for f in found] == ["payload.get('ensemble', 0)", "getattr(request, 'seed', 0)"]
