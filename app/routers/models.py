"""The registered models and datasets: who owns them and where they are loaded; deleting your own."""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse

from app.deps import caller
from core import demo_status, keys, limits, registry
from core.contract.errors import FieldError
from core.kinds.tracin import model_vocab

router = APIRouter(tags=["models"])



@router.get("/models", summary="Registered models: name, kind, parameters, and the workers that hold them",
            description="Each model and dataset has a `status`: `ready` when registered, `preparing` while the demo "
            "preparation has yet to register it (a request naming it is then a 503 with `Retry-After`).")
def list_models(request: Request, _owner: str = Depends(caller)) -> dict[str, Any]:
    settings = request.app.state.settings
    redis = request.app.state.redis
    loaded: dict[str, list[dict[str, Any]]] = {}
    workers = sorted(w.decode() for w in redis.smembers(keys.WORKER_MODELS))
    if workers:
        values = redis.mget([keys.worker_models(w) for w in workers])
        for worker, value in zip(workers, values, strict=True):
            if value is None:  # the worker is gone: its key expired with its heartbeat
                redis.srem(keys.WORKER_MODELS, worker)
                continue
            info = json.loads(value)
            for model in info.get("models", []):
                loaded.setdefault(model["name"], []).append(
                    {"worker": worker, "device": model.get("device"), "loaded_at": model.get("loaded_at"),
                     "loads": model.get("loads")}
                )
    out = []
    for name, entry in sorted(registry.list_models(settings).items()):
        where = loaded.get(name, [])
        out.append(
            {
                "name": name,
                "status": "ready",
                "kind": entry.get("kind"),
                "owner": entry.get("owner"),
                "preload": bool(entry.get("preload")),
                "parameters": entry.get("parameters"),
                "created_at": entry.get("created_at"),
                "devices": sorted({w["device"] for w in where if w.get("device")}),
                "loaded_on": where,
                "meta": entry.get("meta", {}),
            }
        )
    datasets = [
        {"name": name, "status": "ready", "kind": entry.get("kind"), "owner": entry.get("owner"),
         "created_at": entry.get("created_at"), "meta": entry.get("meta", {})}
        for name, entry in sorted(registry.list_datasets(settings).items())
    ]
    demo = demo_status.read(redis)
    out.extend(_preparing(demo, "models", {m["name"] for m in out}))
    datasets.extend(_preparing(demo, "datasets", {d["name"] for d in datasets}))
    return {"models": out, "datasets": datasets}


def _preparing(demo: dict[str, Any], section: str, registered: set[str]) -> list[dict[str, Any]]:
    """The demo's models or datasets that are not registered yet, as ``preparing`` entries."""
    return [{"name": name, "status": "preparing", "kind": None, "owner": None,
             "preparation": {"step": info["step"], "state": info["state"], "retry_after_s": info["retry_after_s"]}}
            for name, info in sorted(demo_status.coming(demo, section).items()) if name not in registered]


NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


def _delete(request: Request, section: str, name: str, owner: str) -> JSONResponse:
    settings = request.app.state.settings
    try:
        entry = registry.delete(settings, section, name, owner)
    except registry.OwnershipError as exc:
        raise HTTPException(status_code=409, detail={"code": "owned_by_other", "message": str(exc)}) from None
    if entry is None:
        raise HTTPException(status_code=404, detail={"code": "not_found", "message": f"no {section[:-1]} {name!r}"})
    return JSONResponse({"deleted": name, "kind": entry.get("kind"), "owner": entry.get("owner")})


@router.delete("/models/{name}", summary="Delete one of your models (another owner's model is 409)",
               responses={404: {}, 409: {}})
def delete_model(request: Request, name: str = Path(..., pattern=NAME), owner: str = Depends(caller)) -> JSONResponse:
    return _delete(request, "models", name, owner)


@router.delete("/datasets/{name}", summary="Delete one of your registered datasets (another owner's is 409)",
               responses={404: {}, 409: {}})
def delete_dataset(request: Request, name: str = Path(..., pattern=NAME),
                   owner: str = Depends(caller)) -> JSONResponse:
    return _delete(request, "datasets", name, owner)


# At most this many names per answer: a form's autocomplete lists, not a dump of a large graph's vocabulary.
MAX_VOCABULARY_NAMES = 1000


@router.get("/models/{name}/vocabulary",
            summary="A knowledge-graph model's entity or relation names (for autocomplete), filtered and bounded",
            responses={404: {}, 422: {}})
def model_vocabulary(
    request: Request,
    name: str = Path(..., pattern=NAME),
    field: Literal["entities", "relations"] = Query(..., description="which names"),
    q: str | None = Query(None, max_length=limits.MAX_TRIPLE_NAME_LENGTH,
                          description="only names holding this text (any case); those starting with it first"),
    limit: int = Query(200, ge=1, le=MAX_VOCABULARY_NAMES),
    _owner: str = Depends(caller),
) -> dict[str, Any]:
    """The names a TracIn request may use for ``model``: whoever may submit a job on a registered model (every
    key: ``GET /models`` lists them all) may read them, and nothing else of the model's files. ``total`` counts
    the model's names, ``matched`` those holding ``q``; ``names`` holds at most ``limit`` of them, sorted."""
    settings = request.app.state.settings
    if registry.get_model(settings, name) is None:
        raise HTTPException(status_code=404, detail={"code": "not_found", "message": f"no model {name!r}",
                                                     "loc": ["path", "name"]})
    try:
        vocab = model_vocab(settings, name)
    except FieldError as exc:
        raise HTTPException(status_code=422, detail=[{"loc": ["path", "name"], "msg": exc.message,
                                                      "type": "value_error", "input": name}]) from None
    names = sorted(vocab[field])
    if q:
        wanted = q.casefold()
        names = sorted((n for n in names if wanted in n.casefold()),
                       key=lambda n: (not n.casefold().startswith(wanted), n))
    return {"model": name, "field": field, "total": len(vocab[field]), "matched": len(names),
            "names": names[:limit]}
