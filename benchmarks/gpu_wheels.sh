#!/usr/bin/env bash
# Fill the wheels folder benchmarks/gpu_suite.sh installs from on a GPU machine without network access: every
# package this environment runs the suite with (the project's own dependencies, pytest and Captum from its dev
# extra), pinned to the versions installed here, except torch, transformers and what only they bring (CUDA
# libraries, triton, tokenizers, huggingface-hub), which the GPU machine has in its own CUDA build.
#
#   bash benchmarks/gpu_wheels.sh                          # wheels for this machine's Python and platform
#   GPU_PYTHON_VERSION=3.12 bash benchmarks/gpu_wheels.sh  # for another Python (binary wheels only)
#
# Writes GPU_WHEELS (default .gpu-wheels at the repository root, ignored by git): the wheels and requirements.txt.
# Settings: PYTHON (default: .venv/bin/python when it exists, else python3), GPU_WHEELS, GPU_PYTHON_VERSION,
# GPU_PLATFORM (default manylinux2014_x86_64, used with GPU_PYTHON_VERSION).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
WHEELS="${GPU_WHEELS:-$ROOT/.gpu-wheels}"
mkdir -p "$WHEELS"

# name==version of every installed distribution the suite needs: the closure of the project's requirements and its
# dev extra, less torch, transformers and the distributions only they require.
"$PY" - "$ROOT" > "$WHEELS/requirements.txt" <<'EOF'
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

root = Path(sys.argv[1])
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
# of the dev extra, what the suite runs: the test runner and Captum (the benchmarks' oracle)
suite_dev = {"pytest", "pytest-timeout", "captum", "pyyaml"}
dev = [r for r in project.get("optional-dependencies", {}).get("dev", [])
       if canonicalize_name(Requirement(r).name) in suite_dev]
wanted = [Requirement(r) for r in project["dependencies"] + dev]
provided = {"torch", "transformers"}  # the GPU machine's own builds
env = default_environment()


def requires(name: str, extras: set[str]) -> list[Requirement]:
    out = []
    for raw in metadata.requires(name) or []:
        req = Requirement(raw)
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})):
            out.append(req)
    return out


def closure(reqs: list[Requirement], skip: set[str]) -> dict[str, str]:
    seen: dict[str, str] = {}
    stack = [(r, set(r.extras)) for r in reqs if r.marker is None or r.marker.evaluate(env)]
    while stack:
        req, extras = stack.pop()
        name = canonicalize_name(req.name)
        if name in skip:
            continue
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # not installed here (an optional extra): not needed by the suite
        if name in seen and not extras:
            continue
        seen[name] = version
        stack.extend((r, set(r.extras)) for r in requires(name, extras))
    return seen


needed = closure(wanted, provided)
# what torch and transformers bring with them (CUDA wheels, tokenizers, ...) stays theirs, unless the project
# names it itself
theirs = set(closure([Requirement(p) for p in provided], set())) - provided
own = {canonicalize_name(r.name) for r in wanted}
for name, version in sorted(needed.items()):
    if name in theirs and name not in own:
        continue
    print(f"{name}=={version}")
EOF

echo "$(wc -l < "$WHEELS/requirements.txt") packages -> $WHEELS/requirements.txt"
args=(download --no-deps --dest "$WHEELS" -r "$WHEELS/requirements.txt")
if [ -n "${GPU_PYTHON_VERSION:-}" ]; then
  args+=(--only-binary=:all: --python-version "$GPU_PYTHON_VERSION" --platform "${GPU_PLATFORM:-manylinux2014_x86_64}")
fi
"$PY" -m pip "${args[@]}"
echo "wheels in $WHEELS: copy the folder next to the repository on the GPU machine, then bash benchmarks/gpu_suite.sh"
