"""The provenance block the runner attaches to every result (``core/contract/results/provenance.py``).

What is the same for every job of a worker (explainq's version and commit, Python, torch and CUDA, the host) is
read once, when this module is imported: the commit from ``EXPLAINQ_GIT_COMMIT`` or the source tree's git files
(no git command is ever run), None when neither says. Per job: the registry records of the models and datasets the
request names (the request fields a kind's pickers name, and ``model``, ``compare_with``, ``dataset``), with each
record's digest (recorded at registration; an older record's is computed once and recorded, never per job), the
request as run, its seeds and precision, the device and the times.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from core import dataset_refs, registry
from core.contract.kind import JobKind, ReduceRequest, ShardRequest
from core.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
REQUEST_INLINE_BYTES = 64 * 1024
MODEL_FIELDS = ("model", "compare_with")
DATASET_FIELDS = ("dataset", "dataset.name")


def _read_commit(root: Path = ROOT) -> str | None:
    """The commit checked out at ``root``, from its git files (a worktree's ``.git`` file, ``HEAD``, loose refs,
    ``packed-refs``); None when it is not a git checkout."""
    env = os.environ.get("EXPLAINQ_GIT_COMMIT", "").strip()
    if env:
        return env
    try:
        git = root / ".git"
        if git.is_file():  # a worktree: "gitdir: <path>"
            git = Path(git.read_text().split(":", 1)[1].strip())
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head or None
        ref = head.split(":", 1)[1].strip()
        common = git
        if (git / "commondir").is_file():
            common = (git / (git / "commondir").read_text().strip()).resolve()
        for base in (git, common):
            if (base / ref).is_file():
                return (base / ref).read_text().strip() or None
        packed = common / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split(" ", 1)[0]
    except (OSError, IndexError):
        return None
    return None


def _software() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        explainq = version("explainq")
    except PackageNotFoundError:
        explainq = None
    try:
        import torch

        torch_version, cuda = str(torch.__version__), torch.version.cuda
    except ImportError:  # pragma: no cover - workers always have torch
        torch_version, cuda = None, None
    return {"explainq": explainq, "commit": _read_commit(), "python": platform.python_version(),
            "torch": torch_version, "cuda": cuda}


SOFTWARE = _software()
HOST = socket.gethostname()


def _at(payload: dict[str, Any], dotted: str) -> Any:
    value: Any = payload
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _fields(spec: JobKind, section: str, defaults: tuple[str, ...]) -> list[str]:
    named = [f for f, (sec, _) in spec.pickers.items() if sec == section]
    return list(dict.fromkeys([*named, *defaults]))


def model_record(settings: Settings, entry: dict[str, Any], field: str | None) -> dict[str, Any]:
    return {"field": field, "name": entry["name"], "kind": entry.get("kind"), "owner": entry.get("owner"),
            "version": registry.version_of(entry), "digest": registry.ensure_digest(settings, "models", entry),
            "registered_at": entry.get("created_at")}


def models_of(settings: Settings, spec: JobKind, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The registered models the request names, as they are now (the job loads these versions)."""
    out = []
    for field in _fields(spec, "models", MODEL_FIELDS):
        name = _at(payload, field)
        if not isinstance(name, str):
            continue
        entry = registry.get_model(settings, name)
        if entry is not None:
            out.append(model_record(settings, entry, field))
    return out


def datasets_of(settings: Settings, spec: JobKind, payload: dict[str, Any], owner: str) -> list[dict[str, Any]]:
    """The datasets the request names, by the rule of ``core/dataset_refs.py`` without its refusals (the request
    was checked at submission): a registered one's version and digest, or a directory (or data the service ships)
    by its name."""
    out = []
    for field in _fields(spec, "datasets", DATASET_FIELDS):
        name = _at(payload, field)
        if not isinstance(name, str):
            continue
        entry = None if dataset_refs.is_path(name) else registry.get_dataset(settings, name)
        if entry is not None and entry.get("owner") not in (owner, registry.SYSTEM) \
                and dataset_refs.is_user_dir(settings, name):
            entry = None
        if entry is None:  # a directory under the data roots, else data the service ships (digits, say)
            source = "directory" if dataset_refs.is_path(name) or dataset_refs.is_user_dir(settings, name) \
                else "packaged"
            out.append({"field": field, "name": name, "source": source})
            continue
        out.append({"field": field, "name": name, "source": "registered", "kind": entry.get("kind"),
                    "owner": entry.get("owner"), "version": registry.version_of(entry),
                    "digest": registry.ensure_digest(settings, "datasets", entry),
                    "registered_at": entry.get("created_at")})
    return out


def _seeds(payload: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(payload, dict):
        for key, value in payload.items():
            path = f"{prefix}{key}"
            if (key == "seed" or key.endswith("_seed") or key == "seeds") and not isinstance(value, dict):
                out[path] = value
            elif isinstance(value, dict):
                out.update(_seeds(value, path + "."))
    return out


def inner_request(request: BaseModel) -> BaseModel:
    """The request a shard or reduce step works for (its parent's), else the request itself."""
    return request.request if isinstance(request, ShardRequest | ReduceRequest) else request


def start(settings: Settings, spec: JobKind, request: BaseModel, owner: str, job_id: str,
          started_at: str) -> dict[str, Any]:
    """What is known of a job when it starts: its models and datasets (read from the registry now), the request."""
    inner = inner_request(request)
    payload = inner.model_dump(mode="json")
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    kind = spec.name.removesuffix("_reduce").removesuffix("_shard") if spec.internal else spec.name
    if isinstance(request, ShardRequest | ReduceRequest):  # a fanned-out request's result is its parent's
        job_id = request.parent
    return {
        "job_id": job_id, "kind": kind,
        "models": models_of(settings, spec, payload),
        "datasets": datasets_of(settings, spec, payload, owner),
        "request": payload if len(text) <= REQUEST_INLINE_BYTES else None,
        "request_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "seeds": _seeds(payload),
        "precision": payload.get("precision") if isinstance(payload.get("precision"), str) else None,
        "software": dict(SOFTWARE), "worker": HOST, "started_at": started_at,
    }


def finish(block: dict[str, Any], result: dict[str, Any], device: Any, registered: list[dict[str, Any]],
           finished_at: str) -> dict[str, Any]:
    """The block completed when the job ends: the precision the result reports it ran at (when it says), the
    device, the models it registered, the end time."""
    out = {**block, "device": str(result.get("device") or device) if (result.get("device") or device) else None,
           "registered": registered, "finished_at": finished_at}
    if isinstance(result.get("precision"), str):
        out["precision"] = result["precision"]
    return out


def digests(block: dict[str, Any]) -> list[str]:
    """The model digests a job can be found by (``GET /jobs?model_digest=``): those it read and registered."""
    return [m["digest"] for m in (*block.get("models", ()), *block.get("registered", ())) if m.get("digest")]
