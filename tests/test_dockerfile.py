"""The Dockerfile against pyproject.toml: every Python an image runs satisfies ``requires-python``, the torch pin
satisfies the torch requirement, and the extras it installs exist (issue 38, part 1).

No image is built here unless ``EXPLAINQ_TEST_DOCKER_BUILD=1`` and a Docker daemon answers: the checks read the
Dockerfile. The Python of a base image is read from its tag (``python:3.11-slim`` is 3.11; ``ubuntu24.04`` in an
``nvidia/cuda`` tag, or ``ubuntu:24.04``, has no Python and gets its release's ``python3`` from apt), so a base or
an apt package this file does not know fails the test instead of passing it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.service import ROOT

# The python3 of each distribution release that a base image may name.
RELEASE_PYTHON3 = {"ubuntu20.04": "3.8", "ubuntu22.04": "3.10", "ubuntu24.04": "3.12",
                   "debian11": "3.9", "debian12": "3.11", "debian13": "3.13"}


@dataclass
class Stage:
    image: str  # as written after FROM
    name: str | None
    args: dict[str, str | None] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)


@dataclass
class Dockerfile:
    global_args: dict[str, str | None]
    stages: list[Stage]
    comments: str


def parse(text: str) -> Dockerfile:
    """Instructions with their continuation lines joined; comments kept apart (they hold the documented builds)."""
    comments, lines, pending = [], [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#"):
            comments.append(raw.lstrip()[1:])
            continue
        pending += raw.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip():
            lines.append(pending.strip())
        pending = ""
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), flags=re.I)
            assert m, line
            stages.append(Stage(m.group(1), m.group(2)))
        elif op == "ARG":
            name, eq, default = rest.strip().partition("=")
            (stages[-1].args if stages else global_args)[name] = default.strip('"') if eq else None
        elif op == "RUN" and stages:
            stages[-1].runs.append(rest)
    return Dockerfile(global_args, stages, "\n".join(comments))


def substitute(value: str, args: dict[str, str | None]) -> str:
    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        assert args.get(name) is not None, f"${name} has no default"
        return args[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, value)


def apt_pythons(runs: list[str]) -> list[str]:
    """Python packages that ``apt-get install`` lines name: ``python3``, ``python3.12``, ``python3.12-venv``..."""
    found = []
    for run in runs:
        for m in re.finditer(r"apt-get\s+install\s+([^&;|]*)", run):
            for word in m.group(1).split():
                p = re.fullmatch(r"python3(?:\.(\d+))?(?:-[\w-]+)?", word)
                if p:
                    found.append(f"3.{p.group(1)}" if p.group(1) else "python3")
    return found


def image_pythons(image: str, runs: list[str]) -> list[str]:
    """The Python versions a stage built on ``image`` (an external image) with ``runs`` may run."""
    official = re.fullmatch(r"(?:docker\.io/)?(?:library/)?python:(\d+\.\d+)[\w.-]*", image)
    release = None
    m = re.search(r"ubuntu[:]?(\d+\.\d+)", image) or re.search(r"debian:?(\d+)", image)
    if m:
        release = ("ubuntu" if "ubuntu" in m.group(0) else "debian") + m.group(1)
    from_apt = apt_pythons(runs)
    if official:
        assert not from_apt, f"{image}: a second Python from apt ({from_apt})"
        return [official.group(1)]
    assert release in RELEASE_PYTHON3, f"{image}: a base whose Python this test does not know"
    assert from_apt, f"{image} has no Python and the stage installs none"
    return [RELEASE_PYTHON3[release] if v == "python3" else v for v in from_apt]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def dockerfile() -> Dockerfile:
    return parse((ROOT / "Dockerfile").read_text())


def external_bases(df: Dockerfile, overrides: dict[str, str] | None = None) -> list[tuple[str, Stage]]:
    """Every stage built on an outside image, with the image as the build arguments (defaults) resolve it."""
    args = {**df.global_args, **(overrides or {})}
    names = {s.name for s in df.stages if s.name}
    out = []
    for stage in df.stages:
        image = substitute(stage.image, args)
        if image not in names:  # not FROM base-${FLAVOR}, one of this file's stages
            out.append((image, stage))
    return out


def test_every_python_the_images_run_satisfies_requires_python():
    df = dockerfile()
    required = SpecifierSet(pyproject()["project"]["requires-python"])
    bases = external_bases(df)
    assert len(bases) >= 2, "a CPU and a CUDA base"
    # The builds the header documents (--build-arg CPU_BASE=... / CUDA_BASE=...) as well as the defaults.
    for name, value in re.findall(r"--build-arg\s+(\w*BASE)=(\S+)", df.comments):
        bases += external_bases(df, {name: value})
    checked = set()
    for image, stage in bases:
        for version in image_pythons(image, stage.runs):
            assert Version(version) in required, f"{image}: Python {version} does not satisfy {required}"
            checked.add((image, version))
    assert any(image.startswith("nvidia/cuda:") for image, _ in checked), checked
    assert ("python:3.11-slim", "3.11") in checked


def test_the_cuda_base_is_a_cuda_image_on_a_release_with_python_3_11_or_newer():
    df = dockerfile()
    cuda = df.global_args["CUDA_BASE"]
    assert cuda.startswith("nvidia/cuda:") and "ubuntu24.04" in cuda, cuda
    stage = next(s for s in df.stages if s.name == "base-cuda")
    assert any("python3 -m venv /opt/venv" in run for run in stage.runs)  # PEP 668: pip in a venv
    # The final stage is chosen by FLAVOR, cpu by default, and both flavours exist.
    assert df.global_args["FLAVOR"] == "cpu"
    assert df.stages[-1].image == "base-${FLAVOR}"
    assert {"base-cpu", "base-cuda"} <= {s.name for s in df.stages}


def test_the_torch_pin_satisfies_pyproject_and_is_a_build_argument():
    df = dockerfile()
    final = df.stages[-1]
    torch = next(Requirement(d) for d in pyproject()["project"]["dependencies"] if d.startswith("torch"))
    version = final.args["TORCH_VERSION"]
    assert version and Version(version) in torch.specifier, (version, str(torch))
    install = next(run for run in final.runs if "torch==" in run)
    assert '"torch==${TORCH_VERSION}"' in install and "--index-url" in install
    assert final.args["TORCH_INDEX_URL_CPU"] == "https://download.pytorch.org/whl/cpu"
    cuda_index = final.args["TORCH_INDEX_URL_CUDA"]
    assert cuda_index == "https://pypi.org/simple" or re.fullmatch(r"https://download\.pytorch\.org/whl/cu\d+",
                                                                   cuda_index), cuda_index
    assert "$TORCH_INDEX_URL_CUDA" in install and "$TORCH_INDEX_URL_CPU" in install


def test_the_extras_the_image_installs_exist():
    df = dockerfile()
    final = df.stages[-1]
    extras = pyproject()["project"]["optional-dependencies"]
    wanted = [e.strip() for e in (final.args["EXTRAS"] or "").split(",") if e.strip()]
    assert {"s3", "gcs"} <= set(wanted)
    assert set(wanted) <= set(extras), set(wanted) - set(extras)
    assert any(Requirement(r).name == "s3fs" for r in extras["s3"])
    assert any(Requirement(r).name == "gcsfs" for r in extras["gcs"])
    assert any(re.search(r"pip install \.\"\[\$\{EXTRAS\}\]\"", run) for run in final.runs)


def test_the_checks_catch_the_old_cuda_build():
    """The Dockerfile before this fix: Ubuntu 22.04's python3 (3.10) under requires-python >=3.11."""
    old = parse("ARG BASE=python:3.11-slim\nFROM ${BASE}\n"
                "RUN apt-get update && apt-get install -y --no-install-recommends \\\n"
                "      python3 python3-pip python3-venv\n")
    required = SpecifierSet(pyproject()["project"]["requires-python"])
    [(image, stage)] = external_bases(old, {"BASE": "nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04"})
    assert image_pythons(image, stage.runs) == ["3.10", "3.10", "3.10"]
    assert Version("3.10") not in required
    assert image_pythons("nvidia/cuda:13.0.0-base-ubuntu24.04", ["apt-get install -y python3.11-venv"]) == ["3.11"]
    with pytest.raises(AssertionError, match="does not know"):
        image_pythons("someone/custom:latest", ["apt-get install -y python3"])
    with pytest.raises(AssertionError, match="installs none"):
        image_pythons("nvidia/cuda:13.0.0-base-ubuntu24.04", [])


@pytest.mark.slow
def test_the_cpu_image_builds_where_a_docker_daemon_answers():
    if os.environ.get("EXPLAINQ_TEST_DOCKER_BUILD") != "1":
        pytest.skip("set EXPLAINQ_TEST_DOCKER_BUILD=1 to build the image (minutes, needs a Docker daemon)")
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode:
        pytest.skip("no Docker daemon")
    subprocess.run(["docker", "build", "-t", "explainq:test", str(ROOT)], check=True, timeout=3600)
    out = subprocess.run(["docker", "run", "--rm", "explainq:test", "python", "-c",
                          "import sys, s3fs, gcsfs, torch, explainq; print(sys.version_info[:2])"],
                         capture_output=True, text=True, check=True)
    assert Version(".".join(re.findall(r"\d+", out.stdout)[:2])) in SpecifierSet(
        pyproject()["project"]["requires-python"])


def test_compose_checks_the_api_on_livez_and_gives_each_worker_a_thread_share():
    import yaml

    from explainq.cli import build_parser

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    check = services["api"]["healthcheck"]
    assert "/livez" in " ".join(check["test"]) and check["test"][0] == "CMD"
    parser = build_parser()
    for name in ("worker-explain", "worker-train"):
        command = services[name]["command"]
        assert "--threads" in command, name
        share = command[command.index("--threads") + 1]
        default = re.fullmatch(r"\$\{\w+:-(\d+)\}", share)
        assert default, share
        args = parser.parse_args([a if a != share else default.group(1) for a in command[1:]])
        assert args.threads == int(default.group(1))
