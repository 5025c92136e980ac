"""``POST /datasets``: register a directory under the data roots as a named dataset of the caller.

The format is detected and validated (:mod:`core.dataset_formats`, in the bounded parser of :mod:`core.bounded`)
before anything is registered; the response carries the
counts. The directory is referenced in place (it lives on the data roots every host mounts). Model imports are a
job kind (``POST /models/import``, :mod:`core.kinds.import_model`): loading weights needs torch.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from app.deps import caller
from core import dataset_refs, limits, registry
from core.bounded import run_bounded
from core.contract.checks import refuse_reserved, require_name_free
from core.contract.errors import FieldConflict, FieldError
from core.contract.fields import RequestModel
from core.userfiles import PathError, display, resolve_data_path

router = APIRouter(tags=["datasets"])

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class DatasetRequest(RequestModel):
    name: str = Field(..., max_length=limits.MAX_NAME_LENGTH, pattern=NAME_PATTERN,
                      description="the name jobs use for this dataset")
    path: str = Field(..., min_length=1, max_length=limits.MAX_PATH_LENGTH,
                      description="a directory under the data roots")
    description: str | None = Field(None, max_length=limits.MAX_DESCRIPTION_LENGTH)
    overwrite: bool = Field(False, description="replace your own dataset of the same name")


@router.post("/datasets", status_code=201, summary="Register a dataset directory under the data roots "
             "(format detected and validated; counts returned)", responses={409: {}, 422: {}})
def register_dataset(body: DatasetRequest, request: Request, owner: str = Depends(caller)) -> JSONResponse:
    settings = request.app.state.settings
    refuse_reserved(body.name, owner, "name", section="datasets")
    try:
        path = resolve_data_path(settings, body.path)
    except PathError as exc:
        raise FieldError(("body", "path"), str(exc), value=body.path) from None
    require_name_free(settings, body.name, owner, "name", section="datasets")
    dataset_refs.check_registrable(settings, body.name, path)
    if registry.get_dataset(settings, body.name) is not None and not body.overwrite:
        raise FieldConflict(("body", "name"), f"you already have a dataset named {body.name!r}; pass "
                            "overwrite=true to replace it", value=body.name)
    # read in the bounded parser (core.bounded): this process never holds the dataset's content
    answer = run_bounded(settings, "dataset.detect", {"path": str(path)}, loc=("body", "path"), value=body.path,
                         shown=display(settings, path))
    if "format_error" in answer:
        raise FieldError(("body", "path"), answer["format_error"], value=body.path)
    if "os_error" in answer:  # a file of the dataset the API cannot read
        raise FieldError(("body", "path"), f"{body.path!r}: a file cannot be read ({answer['os_error']})",
                         value=body.path)
    found = answer["found"]
    meta: dict[str, Any] = {"format": found["format"], "counts": found["counts"]}
    if body.description:
        meta["description"] = body.description
    try:
        entry = registry.register_dataset(settings, body.name, kind=found["kind"], path=path, meta=meta,
                                          owner=owner)
    except registry.OwnershipError as exc:  # registered by another owner in between
        raise FieldConflict(("body", "name"), str(exc), value=body.name) from None
    out = {"name": body.name, "kind": entry["kind"], "owner": owner, "format": found["format"],
           "counts": found["counts"], "path": body.path, "created_at": entry["created_at"]}
    return JSONResponse(status_code=201, content=out, headers={"Location": f"/datasets/{body.name}"})


@router.get("/datasets/{name}", summary="One registered dataset: kind, owner, format and counts",
            responses={404: {}})
def get_dataset(name: str, request: Request, _owner: str = Depends(caller)) -> dict[str, Any]:
    entry = registry.get_dataset(request.app.state.settings, name)
    if entry is None:
        from fastapi import HTTPException

        raise HTTPException(status_code=404, detail={"code": "not_found", "message": f"no dataset {name!r}"})
    meta = entry.get("meta", {})
    return {"name": name, "kind": entry.get("kind"), "owner": entry.get("owner"), "format": meta.get("format"),
            "counts": meta.get("counts"), "created_at": entry.get("created_at"), "meta": meta}
