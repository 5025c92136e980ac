"""The registered models and datasets: who owns them and where they are loaded; deleting your own. Another
tenant's model shows its summary only (:func:`core.ownership.sees_model_details`)."""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse

from app.deps import caller
from core import budgets, demo_status, keys, limits, registry
from core.contract.errors import FieldError
from core.kinds.tracin import model_vocab, vocab_call
from core.ownership import sees_model_details, summary_meta
from core.parsers import match_names

router = APIRouter(tags=["models"])



MODELS_DESCRIPTION = (
    "Each model and dataset has a `status`: `ready` when registered, `preparing` while the demo preparation has yet "
    "to register it (a request naming it is then a 503 with `Retry-After`). A model is shown in full "
    "(`details: \"full\"`: parameters, preload, the workers that hold it and its whole `meta`, with the `job_id` "
    "that produced it) to its owner, and to everyone for the service's own demo models; another tenant's model "
    "shows only its name, kind, owner, version, `created_at` and the metrics of its `meta` (`details: \"summary\"`)."
)


def _loaded(redis: Any) -> dict[str, list[dict[str, Any]]]:
    """Each model name's copies on live workers (a worker whose key expired with its heartbeat is dropped)."""
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
    return loaded


def _model_view(name: str, entry: dict[str, Any], where: list[dict[str, Any]], caller: str) -> dict[str, Any]:
    """One model as ``caller`` may see it (:func:`core.ownership.sees_model_details`)."""
    view: dict[str, Any] = {"name": name, "status": "ready", "kind": entry.get("kind"), "owner": entry.get("owner"),
                            "version": registry.version_of(entry), "created_at": entry.get("created_at")}
    if not sees_model_details(entry, caller):
        return {**view, "details": "summary", "meta": summary_meta(entry.get("meta"))}
    return {**view, "details": "full", "preload": bool(entry.get("preload")), "parameters": entry.get("parameters"),
            "devices": sorted({w["device"] for w in where if w.get("device")}), "loaded_on": where,
            "meta": entry.get("meta", {})}


@router.get("/models", summary="Registered models: name, kind, owner and metrics; parameters and the workers that "
            "hold them for your own", description=MODELS_DESCRIPTION)
def list_models(request: Request, owner: str = Depends(caller)) -> dict[str, Any]:
    settings = request.app.state.settings
    redis = request.app.state.redis
    loaded = _loaded(redis)
    out = [_model_view(name, entry, loaded.get(name, []), owner)
           for name, entry in sorted(registry.list_models(settings).items())]
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
             "preparation": {"step": info["step"], "state": info["state"], "kinds": info["kinds"],
                             "retry_after_s": info["retry_after_s"]}}
            for name, info in sorted(demo_status.coming(demo, section).items()) if name not in registered]


NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


@router.get("/models/{name}", summary="One registered model, shown as in `GET /models`",
            description=MODELS_DESCRIPTION, responses={404: {}})
def get_model(request: Request, name: str = Path(..., pattern=NAME), owner: str = Depends(caller)) -> dict[str, Any]:
    settings = request.app.state.settings
    entry = registry.get_model(settings, name)
    if entry is not None:
        return _model_view(name, entry, _loaded(request.app.state.redis).get(name, []), owner)
    coming = _preparing(demo_status.read(request.app.state.redis), "models", set())
    for m in coming:
        if m["name"] == name:
            return m
    raise HTTPException(status_code=404, detail={"code": "not_found", "message": f"no model {name!r}",
                                                 "loc": ["path", "name"]})


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
    answer = _delete(request, "models", name, owner)
    budgets.forget(request.app.state.redis, owner)  # the store budget measures again
    return answer


@router.delete("/datasets/{name}", summary="Delete one of your registered datasets (another owner's is 409)",
               responses={404: {}, 409: {}})
def delete_dataset(request: Request, name: str = Path(..., pattern=NAME),
                   owner: str = Depends(caller)) -> JSONResponse:
    answer = _delete(request, "datasets", name, owner)
    budgets.forget(request.app.state.redis, owner)
    return answer


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
        if vocab["inline"]:
            found = match_names(vocab[field], q, limit)
        else:  # a vocabulary too large for the API to keep: filtered where it is read
            found = vocab_call(settings, vocab, ("path", "name"), query={"field": field, "q": q, "limit": limit})
    except FieldError as exc:
        raise HTTPException(status_code=422, detail=[{"loc": ["path", "name"], "msg": exc.message,
                                                      "type": "value_error", "input": name}]) from None
    return {"model": name, "field": field, "total": vocab["n_" + field], "matched": found["matched"],
            "names": found["names"]}
