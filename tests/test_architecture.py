"""The layering, stated as rules and checked on every module of the tree.

- ``core/`` (job store and view, registry, store, fan-out bookkeeping, reaping, retention, settings, metrics,
  ownership, user files, job kinds, Redis key names) imports neither FastAPI/Starlette nor torch, nor the HTTP
  package ``app`` nor ``workers``; of ``models`` it may use only the torch-free modules listed here.
- ``app/`` is HTTP only: it never imports torch or ``workers``.
- ``workers/`` never imports the HTTP package ``app``.
- ``models/`` is torch and maths: no FastAPI, no Redis, no service package.
- ``explainq/`` (the command line) sits above all of them.
- Every ``explainq:*`` Redis key is spelled in ``core/keys.py`` only, and docs/DESIGN.md's table of shared state
  names exactly the keys that module lists.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The torch-free modules of ``models`` the core may import (format readers and names shared with the workers).
CORE_MAY_USE = {
    "models.explain.rules",
    "models.files",
    "models.export.files",
    "models.export.kfac",
    "models.export.spec",
    "models.hf.files",
    "models.kg.shapes",
    "models.kg.trak_config",
    "models.kg.tsv",
    "models.lora.keys",
    "models.news.data",
    "models.textdata",
    "models.weight_files",
}


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if ".venv" not in p.parts)


def _imports(path: Path, root: Path = ROOT) -> list[str]:
    """Every module a file imports, at any depth (function-level imports included). ``from a.b import c`` counts
    as ``a.b``, or as ``a.b.c`` when that is a module of the tree under ``root``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            subs = [m for m in subs if (root / (m.replace(".", "/") + ".py")).exists()
                    or (root / m.replace(".", "/")).is_dir()]
            out.extend(subs or [node.module])
    return out


def _violations(package: str, forbidden: tuple[str, ...], models_allowed: set[str] | None = None) -> list[str]:
    """Imports of ``package`` from a ``forbidden`` top-level package; with ``models_allowed``, also imports of a
    ``models`` module not in it."""
    bad = []
    for path in _modules(package):
        for name in _imports(path):
            top = name.split(".")[0]
            if top in forbidden:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
            elif models_allowed is not None and top == "models" and name not in models_allowed:
                bad.append(f"{path.relative_to(ROOT)} imports {name}, not a torch-free models module")
    return bad


def test_core_imports_no_http_no_torch_and_only_torch_free_models() -> None:
    bad = _violations("core", ("fastapi", "starlette", "torch", "app", "workers", "explainq", "uvicorn"),
                      models_allowed=CORE_MAY_USE)
    assert bad == []


def test_app_is_http_only() -> None:
    assert _violations("app", ("torch", "workers", "explainq")) == []


def test_workers_never_import_the_http_package() -> None:
    assert _violations("workers", ("app", "fastapi", "starlette", "explainq")) == []


def test_models_know_nothing_of_the_service() -> None:
    assert _violations("models", ("app", "core", "workers", "explainq", "fastapi", "starlette", "redis", "rq")) == []


MODEL_FAMILIES = ("models.kg", "models.news", "models.vision", "models.lora", "models.hf")


def test_explain_methods_import_no_model_family() -> None:
    """``models/explain`` is model-agnostic: a family supplies its gradients, projector or forward function through
    the interfaces there, and nothing there imports a family (statically, function-level imports included)."""
    bad = [f"{path.relative_to(ROOT)} imports {name}" for path in _modules("models/explain")
           for name in _imports(path) if name.startswith(tuple(f + "." for f in MODEL_FAMILIES))
           or name in MODEL_FAMILIES]
    assert bad == []


SDK_ROOT = ROOT / "clients" / "python" / "src"


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _circles(paths: list[Path], root: Path = ROOT) -> list[str]:
    """The import circles among ``paths`` (module names relative to ``root``): function-level imports count, a
    circle hidden in a function being still one."""
    graph = {_module_name(p, root): set() for p in paths}
    for p in paths:
        graph[_module_name(p, root)] = {m for m in _imports(p, root) if m in graph and m != _module_name(p, root)}
    circles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return circles


def test_no_package_has_import_circles() -> None:
    """No two modules import each other, directly or through others: the service's packages together, and the
    SDK on its own."""
    service = [p for package in ("models", "core", "app", "workers", "explainq") for p in _modules(package)]
    assert _circles(service) == []
    assert _circles(sorted((SDK_ROOT / "explainq_client").rglob("*.py")), SDK_ROOT) == []


def test_the_torch_free_models_modules_really_are() -> None:
    """What the rule above allows the core must not pull torch (or numpy's heavy friends) in at import."""
    code = ("import sys, importlib\n"
            f"for m in {sorted(CORE_MAY_USE)!r}: importlib.import_module(m)\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_every_core_module_imports_without_torch_or_fastapi() -> None:
    """At run time too (the static rule cannot see what a third-party import pulls in)."""
    code = ("import sys, importlib, pkgutil, core, core.contract.kind\n"
            "for info in pkgutil.walk_packages(core.__path__, 'core.'): importlib.import_module(info.name)\n"
            "core.contract.kind.load_kinds()\n"
            "bad = [m for m in ('torch', 'fastapi', 'starlette', 'app', 'workers') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_the_worker_process_does_not_load_the_http_stack() -> None:
    code = ("import sys, workers.worker, workers.runner, workers.context\n"
            "bad = [m for m in ('fastapi', 'starlette', 'app') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def _key_literals(path: Path) -> list[str]:
    """String constants (not docstrings) that spell an ``explainq:`` key."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("explainq:")
            and id(n) not in docstrings]


@pytest.mark.parametrize("package", ["app", "core", "workers", "explainq"])
def test_redis_key_names_are_spelled_only_in_core_keys(package: str) -> None:
    bad = [f"{p.relative_to(ROOT)}: {lit!r}" for p in _modules(package) if p != ROOT / "core" / "keys.py"
           for lit in _key_literals(p)]
    assert bad == []


def test_design_md_key_table_matches_core_keys() -> None:
    from core.keys import KEYS

    text = (ROOT / "docs" / "DESIGN.md").read_text()
    table = re.findall(r"^\| `(explainq:[^`]*)`", text, flags=re.M)
    documented = set()
    for cell in table:  # a row may name two keys: `explainq:registry:models` / `:datasets`
        documented.add(cell)
    rows = re.findall(r"^\| (`explainq:[^|]*)\|", text, flags=re.M)
    for row in rows:
        for key in re.findall(r"`(explainq:[^`]*)`", row):
            documented.add(key)
    assert documented == set(KEYS), (sorted(set(KEYS) - documented), sorted(documented - set(KEYS)))
