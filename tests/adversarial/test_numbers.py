"""Adversarial numbers, sizes and names: every bad input is a 4xx naming the field with a JSON body, never a 500.

Runs against the real app over a private Redis (no worker: accepted jobs stay queued).
"""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from core.settings import Settings
from tests.service import api_client
from tests.test_kinds_contract import PRODUCT_KINDS, _objects

NON_FINITE = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity", "1e999": "Infinity",
              "-1e999": "-Infinity"}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("numbers")
    (home / "data").mkdir()
    return home


@pytest.fixture(scope="module")
def client(home):
    with api_client(home) as c:
        yield c


def strict_json(text: str):
    """The body as JSON, refusing the non-standard NaN / Infinity tokens Python's json module would accept."""

    def refuse(token: str):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def post_raw(client: TestClient, route: str, raw: str):
    return client.post(route, content=raw.encode(), headers={"content-type": "application/json"})


def errors_at(response, loc: tuple) -> list[dict]:
    body = strict_json(response.text)
    return [d for d in body["detail"] if tuple(d["loc"]) == loc]


def errors_under(response, loc: tuple) -> list[dict]:
    """Errors at ``loc`` or inside it (a union's member: ("body", "shard_size", "constrained-int"))."""
    body = strict_json(response.text)
    return [d for d in body["detail"] if tuple(d["loc"][:len(loc)]) == loc]


# ------------------------------------------------------------------------------ 1. non-finite numbers in errors


@pytest.mark.parametrize("token", sorted(NON_FINITE))
@pytest.mark.parametrize("route, template, loc", [
    ("/tracin", '{"model": "m", "top_k": %s}', ("body", "top_k")),                      # int field
    ("/tracin", '{"model": "m", "filter": {"n_hops": %s}}', ("body", "filter", "n_hops")),  # nested model
    ("/tracin", '{"model": "m", "no_such_field": %s}', ("body", "no_such_field")),      # extra_forbidden
    ("/tracin", '{"model": "m", "no_such_field": [1, {"x": %s}]}', ("body", "no_such_field")),
    ("/tracin", '{"model": %s}', ("body", "model")),                                  # string field
    ("/datasets", '{"name": "d", "path": %s}', ("body", "path")),                     # a plain route
])
def test_non_finite_input_is_echoed_as_a_string_in_a_json_422(client, route, template, loc, token):
    r = post_raw(client, route, template % token)
    assert r.status_code == 422, r.text
    found = errors_at(r, loc)
    assert found, r.text
    assert {"type", "loc", "msg", "input"} <= set(found[0])  # FastAPI's error shape, kept
    assert NON_FINITE[token] in json.dumps(found[0]["input"]), found


@pytest.mark.parametrize("token", sorted(NON_FINITE))
def test_a_non_finite_body_is_a_json_422(client, token):
    r = post_raw(client, "/tracin", token)
    assert r.status_code == 422, r.text
    assert errors_at(r, ("body",))[0]["input"] == NON_FINITE[token]


# ------------------------------------------------------------------ 1b. request models refuse non-finite numbers


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation names (through unions, lists, Annotated, dicts)."""
    found = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found.append(annotation)
    for arg in typing.get_args(annotation):
        found.extend(_models_in(arg))
    return found


def model_classes(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model class reachable from a request model's fields, by class name (the JSON schema's title)."""
    out: dict[str, type[BaseModel]] = {}
    stack = [model]
    while stack:
        m = stack.pop()
        if m.__name__ not in out:
            out[m.__name__] = m
            for f in m.model_fields.values():
                stack.extend(_models_in(f.annotation))
    return out


def request_models() -> dict[str, type[BaseModel]]:
    from app.routers.imports import DatasetRequest

    return {**{name: kind.request for name, kind in PRODUCT_KINDS.items()}, "POST /datasets": DatasetRequest}


def number_fields() -> list[tuple[str, str, str, str]]:
    """(request, route, nested object path, field) of every float field of every request, nested ones included
    (the walker of tests/test_kinds_contract.py)."""
    from app.routers.imports import DatasetRequest

    routes = {**{name: kind.route for name, kind in PRODUCT_KINDS.items()}, "POST /datasets": "/datasets"}
    out = []
    for name, model in request_models().items():
        schema = model.model_json_schema()
        for path, obj in _objects(schema, schema.get("$defs", {})):
            for field, prop in obj["properties"].items():
                alts = prop.get("anyOf", [prop])
                if any(a.get("type") == "number" for a in alts):
                    out.append((name, routes[name], path, field))
    assert DatasetRequest  # the plain route has no float field today; the loop covers it when it gets one
    return out


def _body(path: str, field: str, value) -> tuple[dict, tuple]:
    """A body setting ``field`` of the object at ``path`` ("body.model", "body.checkpoints[]") to ``value``,
    and the error location that names it."""
    parts = path.split(".")[1:]
    inner: dict = {field: value}
    loc: list = [field]
    for part in reversed(parts):
        if part.endswith("[]"):
            inner, loc = {part[:-2]: [inner]}, [part[:-2], 0, *loc]
        else:
            inner, loc = {part: inner}, [part, *loc]
    return inner, ("body", *loc)


@pytest.mark.parametrize("name", sorted(request_models()))
def test_every_request_model_refuses_non_finite_numbers(name):
    """allow_inf_nan=False on the request model and on every model nested in it (the shared base config)."""
    model = request_models()[name]
    classes = model_classes(model)
    schema = model.model_json_schema()
    titles = {obj.get("title") for _, obj in _objects(schema, schema.get("$defs", {}))}
    assert titles <= set(classes), titles - set(classes)
    lax = [n for n, cls in classes.items() if cls.model_config.get("allow_inf_nan") is not False]
    assert lax == []
    assert all(cls.model_config.get("extra") == "forbid" for cls in classes.values())


def test_number_fields_are_found():
    found = {(name, path, field) for name, _, path, field in number_fields()}
    assert ("train_conve", "body", "weight_decay") in found
    assert ("import_model", "body.checkpoints[]", "lr") in found
    assert ("train_bdh", "body.model", "dropout") in found


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("name, route, path, field", number_fields())
def test_non_finite_number_in_any_float_field_is_422_naming_it(client, name, route, path, field, value):
    body, loc = _body(path, field, value)
    r = post_raw(client, route, json.dumps(body))
    assert r.status_code == 422, r.text
    found = [d for d in strict_json(r.text)["detail"] if tuple(d["loc"][:len(loc)]) == loc]
    assert any(d["type"] == "finite_number" for d in found), (loc, r.text)


def test_infinite_weight_decay_no_longer_queues_a_training_job(client):
    """Infinity passes ge=0; it used to be queued and fail in the worker."""
    r = post_raw(client, "/train/conve", '{"name": "inf-decay", "weight_decay": Infinity}')
    assert r.status_code == 422, r.text
    assert errors_at(r, ("body", "weight_decay"))[0]["input"] == "Infinity"


@pytest.mark.parametrize("raw", ['{"embedding_height": Infinity}', '{"a": [1, {"b": NaN}]}',
                                 '{"embedding_dim": -1e999}'])
def test_non_finite_number_in_a_free_form_config_is_422(client, raw):
    r = post_raw(client, "/models/import", '{"name": "m", "kind": "conve", "path": "p", "config": ' + raw + "}")
    assert r.status_code == 422, r.text
    assert errors_at(r, ("body", "config")), r.text


# ----------------------------------------------------------------------------------- 3. integers in query strings


@pytest.fixture(scope="module")
def own_job(client) -> str:
    """A job of the caller's (queued: no worker runs here)."""
    r = client.post("/train/conve", json={"name": "cursor-parent", "epochs": 1})
    assert r.status_code == 202, r.text
    return r.json()["id"]


@pytest.mark.parametrize("cursor", ["\u00b2", "\u0663", "\uff11", "9" * 5000, "-1", " 1", "1.0", "+1", "0x1", ""])
def test_malformed_child_cursor_is_422_naming_it(client, own_job, cursor):
    """``str.isdigit`` accepts superscripts ('²'), which ``int`` refuses (a 500), and other scripts' digits;
    a 5000-digit cursor exceeds ``int``'s digit limit."""
    r = client.get("/jobs", params={"parent": own_job, "cursor": cursor})
    assert r.status_code == 422, r.text
    assert errors_at(r, ("query", "cursor")), r.text


def test_child_cursor_pages_as_before(client, own_job):
    r = client.get("/jobs", params={"parent": own_job, "cursor": "0"})
    assert r.status_code == 200, r.text
    assert r.json() == {"items": [], "next_cursor": None}


# ------------------------------------------------------------------------- 2. one table of limits (core/limits.py)


def _unbounded(schema: dict, defs: dict, path: str = "body"):
    """(path, what) for every integer without a maximum, string without a maxLength, array without maxItems and
    free-form object without maxProperties in a request schema, nested ones included."""
    if "$ref" in schema:
        yield from _unbounded(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, path)
        return
    if "const" in schema or "enum" in schema:
        return
    for key in ("anyOf", "oneOf", "allOf"):
        for alt in schema.get(key, []):
            yield from _unbounded(alt, defs, path)
    kind = schema.get("type")
    if kind == "integer" and "maximum" not in schema and "exclusiveMaximum" not in schema:
        yield path, "integer without maximum"
    if kind == "string" and "maxLength" not in schema:
        yield path, "string without maxLength"
    if kind == "array":
        if "maxItems" not in schema:
            yield path, "array without maxItems"
        for item in [schema["items"]] if isinstance(schema.get("items"), dict) else schema.get("prefixItems", []):
            yield from _unbounded(item, defs, path + "[]")
    if kind == "object":
        for name, prop in schema.get("properties", {}).items():
            yield from _unbounded(prop, defs, f"{path}.{name}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) or extra is True:
            if "maxProperties" not in schema:
                yield path, "object without maxProperties"
            if isinstance(extra, dict):
                yield from _unbounded(extra, defs, path + "{}")


@pytest.mark.parametrize("name", sorted(request_models()))
def test_every_count_size_and_string_of_every_request_is_bounded(name):
    schema = request_models()[name].model_json_schema()
    assert list(_unbounded(schema, schema.get("$defs", {}))) == []


def _bounds_at(schema: dict, defs: dict, parts: list[str]) -> set[int]:
    """The upper bounds (maximum, maxLength, maxItems, maxProperties) of the node(s) at a dotted limit path."""
    if "$ref" in schema:
        return _bounds_at(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, parts)
    found: set[int] = set()
    for alt in schema.get("anyOf", []):
        found |= _bounds_at(alt, defs, parts)
    if not parts:
        return found | {schema[k] for k in ("maximum", "maxLength", "maxItems", "maxProperties") if k in schema}
    head, rest = parts[0], parts[1:]
    if head == "[]" and isinstance(schema.get("items"), dict):
        found |= _bounds_at(schema["items"], defs, rest)
    elif head in schema.get("properties", {}):
        found |= _bounds_at(schema["properties"][head], defs, rest)
    return found


def _limit_path(field: str) -> tuple[str, list[str]]:
    kind, _, rest = field.partition(".")
    parts: list[str] = []
    for part in rest.split("."):
        name = part.rstrip("[]")
        parts += [name] + ["[]"] * ((len(part) - len(name)) // 2)
    return ("POST /datasets" if kind == "datasets" else kind), parts


def test_every_limit_is_applied_where_the_table_says():
    from core.limits import LIMITS

    models = request_models()
    for limit in LIMITS.values():
        for field in limit.fields:
            name, parts = _limit_path(field)
            schema = models[name].model_json_schema()
            assert limit.value in _bounds_at(schema, schema.get("$defs", {}), parts), (limit.name, field)


@pytest.mark.parametrize("route, body, loc", [
    ("/tracin", {"model": "m", "top_k": 50_000_000}, ("body", "top_k")),         # 2.8 GB of a shared worker
    ("/tracin", {"model": "m", "top_k": 1e18}, ("body", "top_k")),               # a float with no fraction: an int
    ("/tracin", {"model": "m", "top_k": 1e20}, ("body", "top_k")),
    ("/tracin", {"model": "m", "top_k": 1e23}, ("body", "top_k")),
    ("/tracin", {"model": "m", "batch_size": 10**6}, ("body", "batch_size")),
    ("/tracin", {"model": "m", "filter": {"min_degree": 2**70}}, ("body", "filter", "min_degree")),
    ("/tracin", {"model": "m", "shard_size": 10**12}, ("body", "shard_size")),
    ("/tracin", {"model": "m" * 10_000}, ("body", "model")),
    ("/tracin", {"model": "m", "checkpoints": ["c"] * 5000}, ("body", "checkpoints")),
    ("/attributions", {"model": "m", "batch_size": 10**9}, ("body", "batch_size")),
    ("/attributions", {"model": "m", "dataset": {"name": "d", "seed": 2**70}}, ("body", "dataset", "seed")),
    ("/train/conve", {"name": "x", "seed": 2**70}, ("body", "seed")),
    ("/train/conve", {"name": "x", "seed": -1}, ("body", "seed")),
    ("/train/conve", {"name": "x", "embedding_height": 10**30}, ("body", "embedding_height")),
    ("/train/news", {"name": "x", "dataset": "d", "seed": 2**64}, ("body", "seed")),
    ("/train/bdh", {"max_train_samples": 10**30}, ("body", "max_train_samples")),
    ("/train/bdh", {"resume_from": "j" * 10_000}, ("body", "resume_from")),
    ("/models/import", {"name": "m", "kind": "conve", "path": "p", "config": {str(i): i for i in range(1000)}},
     ("body", "config")),
    ("/ablations", {"dataset": "d", "representations": ["x" * 100_000]}, ("body", "representations")),
])
def test_over_a_limit_is_422_naming_the_field(client, route, body, loc):
    r = client.post(route, json=body)
    assert r.status_code == 422, r.text
    found = errors_under(r, loc)
    assert found and all(d["type"] != "missing" for d in found), r.text


@pytest.fixture(scope="module")
def conve_model(client, home):
    """A registered ConvE model's files as TracIn validation reads them (a toy vocabulary, no weights)."""
    from core import registry

    settings = client.app.state.settings
    src = home / "toy-conve"
    (src / "data").mkdir(parents=True)
    (src / "data" / "entities.dict").write_text("".join(f"e{i}\t{i}\n" for i in range(2000)))
    (src / "data" / "relations.dict").write_text("r0\t0\n")
    (src / "config.json").write_text(json.dumps({"checkpoints": [{"file": "checkpoints/epoch_0001.safetensors",
                                                                   "epoch": 1, "lr": 0.01}]}))
    registry.register_model(settings, "toy-conve", kind="conve", loader="models.kg.checkpoint:load", path=src,
                            owner="system")
    return "toy-conve"


def test_tracin_test_triples_times_top_k_is_bounded(client, conve_model):
    from core.limits import MAX_TRACIN_LISTED

    triples = [[f"e{i}", "r0", f"e{i + 1}"] for i in range(1000)]
    r = client.post("/tracin", json={"model": conve_model, "test_triples": triples,
                                     "top_k": MAX_TRACIN_LISTED // 1000 + 1})
    assert r.status_code == 422, r.text
    assert "1000 test triples x top_k" in errors_at(r, ("body", "top_k"))[0]["msg"]
    r = client.post("/tracin", json={"model": conve_model, "test_triples": triples,
                                     "top_k": MAX_TRACIN_LISTED // 1000})
    assert r.status_code == 202, r.text


def test_attribution_rows_per_pass_are_bounded_naming_both_fields(client, home):
    from core import registry
    from core.limits import MAX_IG_ROWS_PER_PASS

    (home / "toy-news").mkdir()
    (home / "toy-news" / "config.json").write_text("{}")
    registry.register_model(client.app.state.settings, "toy-news", kind="news", loader="x:y", path=home / "toy-news",
                            owner="system")
    sample = {"id": "a", "history": ["t"], "candidate": "c"}
    r = client.post("/attributions", json={"model": "toy-news", "samples": [sample], "alpha_batch_size": 4096,
                                           "batch_size": MAX_IG_ROWS_PER_PASS // 4096 + 1})
    assert r.status_code == 422, r.text
    assert [tuple(d["loc"]) for d in strict_json(r.text)["detail"]] == [("body", "batch_size"),
                                                                      ("body", "alpha_batch_size")]
    r = client.post("/attributions", json={"model": "toy-news", "samples": [sample], "alpha_batch_size": 4096,
                                           "batch_size": MAX_IG_ROWS_PER_PASS // 4096})
    assert r.status_code == 202, r.text


# ------------------------------------------------------------------------ 2b. memory estimates of training requests

# An estimate of the activations a step saves for its backward pass is within this factor of what a real step
# of the torch model saves (measured with saved-tensor hooks); parameter counts are exact.
SAVED_TOLERANCE = (0.8, 1.5)


def _saved_bytes(step) -> int:
    """Bytes of the distinct storages a forward pass saves for its backward pass."""
    from torch.autograd.graph import saved_tensors_hooks

    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(seen.values())


@pytest.mark.parametrize("n_ent, n_rel, dim, height, filters, batch, reciprocal", [
    (14, 55, 200, None, 32, 128, True),      # the defaults on nations
    (1000, 20, 200, 10, 32, 256, True),
    (5000, 10, 64, 8, 16, 128, False),
    (300, 7, 96, 4, 8, 64, True),
])
def test_conve_estimate_matches_the_real_model(n_ent, n_rel, dim, height, filters, batch, reciprocal):
    import torch

    from core import memory
    from models.kg.conve import ConvE, ConvEConfig, default_height, triple_loss

    est = memory.conve_training(n_ent, n_rel, dim, height, filters, batch, reciprocal)
    model = ConvE(ConvEConfig(num_entities=n_ent, num_relations=n_rel, embedding_dim=dim,
                              embedding_height=height or default_height(dim), num_filters=filters,
                              reciprocal=reciprocal))
    assert est.parameters == sum(p.numel() for p in model.parameters())
    model.train()
    g = torch.Generator().manual_seed(0)
    triples = torch.stack([torch.randint(0, n_ent, (batch,), generator=g), torch.randint(0, n_rel, (batch,), generator=g),
                           torch.randint(0, n_ent, (batch,), generator=g)], 1)
    measured = _saved_bytes(lambda: triple_loss(model, triples).mean())
    lo, hi = SAVED_TOLERANCE
    assert lo * measured <= est.saved_bytes <= hi * measured, (est.saved_bytes, measured)


@pytest.mark.parametrize("n_layer, n_embd, n_head, mult, cls_token, classes, batch", [
    (2, 32, 2, 4, False, 10, 8),
    (6, 192, 6, 32, False, 10, 4),           # the default architecture
    (2, 64, 4, 8, True, 100, 16),
])
def test_bdh_estimate_matches_the_real_model(n_layer, n_embd, n_head, mult, cls_token, classes, batch):
    import torch

    from core import memory
    from models.vision.bdh import VisionBDH
    from models.vision.config import VisionBDHConfig

    est = memory.bdh_training(n_layer, n_embd, n_head, mult, cls_token, classes, batch)
    model = VisionBDH(VisionBDHConfig(n_layer=n_layer, n_embd=n_embd, n_head=n_head, mlp_multiplier=mult,
                                      cls_token=cls_token, num_classes=classes))
    assert est.parameters == sum(p.numel() for p in model.parameters())
    model.train()
    images = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(batch) % classes
    measured = _saved_bytes(lambda: torch.nn.functional.cross_entropy(model(images), labels))
    lo, hi = SAVED_TOLERANCE
    assert lo * measured <= est.saved_bytes <= hi * measured, (est.saved_bytes, measured)


def test_conve_that_cannot_fit_a_worker_is_422_saying_what_it_needs(client):
    r = client.post("/train/conve", json={"name": "huge", "embedding_dim": 4096, "num_filters": 1024})
    assert r.status_code == 422, r.text
    detail = strict_json(r.text)["detail"]
    assert [tuple(d["loc"]) for d in detail] == [("body", "embedding_dim"), ("body", "num_filters"),
                                               ("body", "batch_size")]
    msg = detail[0]["msg"]
    assert "would need about" in msg and "EXPLAINQ_WORKER_MEMORY_BYTES" in msg
    need = float(msg.split("would need about ")[1].split(" GiB")[0].replace(",", ""))
    assert need > 131e9 / 2**30  # the fc layer's weights alone are 131 GB


def test_conve_batch_that_cannot_fit_names_batch_size_first(client, home):
    from core import registry

    data = home / "data" / "big-kg"
    data.mkdir()
    (data / "train.txt").write_text("a\tr\tb\n")
    registry.register_dataset(client.app.state.settings, "big-kg", kind="triples", path=data,
                              meta={"counts": {"entities": 100_000, "relations": 50}}, owner="anonymous")
    r = client.post("/train/conve", json={"name": "wide-batch", "dataset": "big-kg", "batch_size": 65_536})
    assert r.status_code == 422, r.text
    assert strict_json(r.text)["detail"][0]["loc"] == ["body", "batch_size"]
    r = client.post("/train/conve", json={"name": "wide-batch", "dataset": "big-kg", "batch_size": 128})
    assert r.status_code == 202, r.text


def test_the_worker_memory_budget_comes_from_settings(tmp_path):
    from core.contract.errors import FieldError
    from core.kinds.train_conve import TrainConvERequest, check_memory

    req = TrainConvERequest(name="m")
    check_memory(req, Settings(EXPLAINQ_HOME=str(tmp_path)))  # the defaults fit the default budget
    with pytest.raises(FieldError):
        check_memory(req, Settings(EXPLAINQ_HOME=str(tmp_path), EXPLAINQ_WORKER_MEMORY_BYTES=2**20))
    huge = TrainConvERequest(name="m", embedding_dim=4096, num_filters=1024)
    check_memory(huge, Settings(EXPLAINQ_HOME=str(tmp_path), EXPLAINQ_WORKER_MEMORY_BYTES=0))  # 0: no check


def test_bdh_that_cannot_fit_a_worker_is_422_naming_the_fields(client):
    r = client.post("/train/bdh", json={"model": {"n_embd": 4096, "n_head": 8, "mlp_multiplier": 512}})
    assert r.status_code == 422, r.text
    detail = strict_json(r.text)["detail"]
    assert "25,770,307,594 parameters" in detail[0]["msg"]
    assert {tuple(d["loc"]) for d in detail} == {("body", "model", "n_embd"), ("body", "model", "mlp_multiplier"),
                                                 ("body", "batch_size"), ("body", "model", "n_layer")}
    r = client.post("/train/bdh", json={"batch_size": 8192})  # the default model, a batch of 8192 images
    assert r.status_code == 422, r.text
    assert strict_json(r.text)["detail"][0]["loc"] == ["body", "batch_size"]
    r = client.post("/train/bdh", json={})  # the defaults fit
    assert r.status_code == 202, r.text


def test_news_training_tokens_per_step_are_bounded(client):
    r = client.post("/train/news", json={"name": "n", "dataset": "d", "batch_size": 4096, "max_history": 500,
                                         "max_title_len": 512})
    assert r.status_code == 422, r.text
    detail = strict_json(r.text)["detail"]
    assert [tuple(d["loc"]) for d in detail] == [("body", "batch_size"), ("body", "max_history"), ("body", "npratio"),
                                               ("body", "max_title_len")]


# ----------------------------------------------------------------------- 4. paths longer than the file system allows

LONG_COMPONENT = "a" * 300            # over NAME_MAX (255 bytes): ENAMETOOLONG from the file system
LONG_PATH = "/".join(["b" * 200] * 15)  # 3,014 characters: over MAX_PATH_LENGTH


@pytest.fixture(scope="module")
def model_dir(home) -> str:
    (home / "data" / "imports" / "m").mkdir(parents=True)
    (home / "data" / "imports" / "m" / "model.safetensors").write_bytes(b"")
    return "imports/m"


PATH_FIELDS = [
    ("/ablations", lambda p: {"dataset": p}, ("body", "dataset")),
    ("/datasets", lambda p: {"name": "long", "path": p}, ("body", "path")),
    ("/models/import", lambda p: {"name": "long", "kind": "conve", "path": p}, ("body", "path")),
    ("/train/news", lambda p: {"name": "long", "dataset": p}, ("body", "dataset")),
    ("/train/conve", lambda p: {"name": "long", "dataset": p}, ("body", "dataset")),
    ("/train/bdh", lambda p: {"dataset": "cifar10", "data_dir": p}, ("body", "data_dir")),
]


@pytest.mark.parametrize("path", [LONG_COMPONENT, "x/" + LONG_COMPONENT + "/y", LONG_PATH])
@pytest.mark.parametrize("route, body, loc", PATH_FIELDS)
def test_a_path_longer_than_the_file_system_allows_is_422_naming_it(client, route, body, loc, path):
    r = client.post(route, json=body(path))
    assert r.status_code == 422, r.text
    assert errors_at(r, loc), r.text


@pytest.mark.parametrize("path", ["~0", "~no-such-user/data", "~\u00e9"])
@pytest.mark.parametrize("route, body, loc", PATH_FIELDS)
def test_a_home_directory_of_no_user_is_422_naming_it(client, route, body, loc, path):
    """``~0`` asked for the home directory of a user who does not exist: expanduser raised RuntimeError, a 500
    (found by schemathesis)."""
    r = client.post(route, json=body(path))
    assert r.status_code == 422, r.text
    assert errors_at(r, loc), r.text


@pytest.mark.parametrize("path", [LONG_COMPONENT, LONG_PATH])
def test_a_long_test_triples_path_is_422_naming_it(client, conve_model, path):
    r = client.post("/tracin", json={"model": conve_model, "test_triples_path": path})
    assert r.status_code == 422, r.text
    assert errors_at(r, ("body", "test_triples_path")), r.text


@pytest.mark.parametrize("field", ["weights", "entities", "relations", "valid_triples", "test_triples", "vocab"])
@pytest.mark.parametrize("name", [LONG_COMPONENT, "a\x00b"])
def test_a_file_name_the_file_system_refuses_is_422_naming_it(client, model_dir, field, name):
    r = client.post("/models/import", json={"name": "long", "kind": "conve", "path": model_dir, field: name})
    assert r.status_code == 422, r.text
    assert errors_at(r, ("body", field)), r.text


@pytest.mark.parametrize("name", [LONG_COMPONENT, "a\x00b"])
def test_a_checkpoint_file_name_the_file_system_refuses_is_422_naming_it(client, model_dir, name):
    (Path(client.app.state.settings.data_roots[0]) / model_dir / "train.txt").write_text("a\tr\tb\n")
    r = client.post("/models/import", json={"name": "long", "kind": "conve", "path": model_dir,
                                            "checkpoints": [{"file": name, "lr": 0.1}]})
    assert r.status_code == 422, r.text
    assert errors_at(r, ("body", "checkpoints", 0, "file")), r.text


@pytest.mark.parametrize("field", ["pretrained_path", "glove_path"])
def test_long_news_encoder_paths_are_422_naming_them(client, home, field):
    news = home / "data" / "news"
    (news / "train").mkdir(parents=True, exist_ok=True)
    (news / "train" / "behaviors.tsv").write_text("")
    encoder = "pretrained" if field == "pretrained_path" else "word"
    r = client.post("/train/news", json={"name": "long", "dataset": "news", "valid_split": None, "encoder": encoder,
                                         field: LONG_COMPONENT})
    assert r.status_code == 422, r.text
    assert errors_at(r, ("body", field)), r.text


# ------------------------------------------------------------- strings that are not Unicode text (lone surrogates)


def string_fields() -> list[tuple[str, str, str, str]]:
    """(request, route, nested object path, field) of every field of every request that takes a string (or
    strings), nested ones included."""
    routes = {**{name: kind.route for name, kind in PRODUCT_KINDS.items()}, "POST /datasets": "/datasets"}
    out = []

    def takes_text(prop: dict, defs: dict) -> bool:
        if "$ref" in prop:
            return False
        alts = prop.get("anyOf", [prop])
        return any(a.get("type") == "string" and "enum" not in a and "const" not in a
                   or a.get("type") == "array" and takes_text(a.get("items", {}), defs) for a in alts)

    for name, model in request_models().items():
        schema = model.model_json_schema()
        for path, obj in _objects(schema, schema.get("$defs", {})):
            for field, prop in obj["properties"].items():
                if takes_text(prop, schema.get("$defs", {})):
                    out.append((name, routes[name], path, field))
    return out


def test_string_fields_are_found():
    found = {(name, path, field) for name, _, path, field in string_fields()}
    assert {("tracin", "body", "model"), ("attributions", "body.samples[]", "history"),
            ("import_model", "body.checkpoints[]", "file"), ("POST /datasets", "body", "path")} <= found


@pytest.mark.parametrize("name, route, path, field", string_fields())
def test_a_lone_surrogate_in_any_string_field_is_a_json_422_naming_it(client, name, route, path, field):
    """JSON's \\ud800 escape decodes to a lone surrogate, which no file system, Redis client or UTF-8 response
    can encode: refused as a 422 on its field, and never echoed as it came."""
    schema = request_models()[name].model_json_schema()
    prop = dict(_objects(schema, schema.get("$defs", {})))[path]["properties"][field]
    takes_list = any(a.get("type") == "array" for a in prop.get("anyOf", [prop]))
    body, loc = _body(path, field, ["x\ud800"] if takes_list else "x\ud800")
    r = post_raw(client, route, json.dumps(body))
    assert r.status_code == 422, r.text
    r.content.decode("utf-8")  # valid UTF-8
    found = [d for d in strict_json(r.text)["detail"] if tuple(d["loc"][:len(loc)]) == loc]
    assert found, (loc, r.text)
    assert "\ud800" not in r.text


@pytest.mark.parametrize("raw", ['{"model": "m", "\\ud800": 1}', '{"model": "m", "x": "\\udfff"}',
                                 '{"model": "m", "x": {"\\ud800": ["\\ud800"]}}'])
def test_a_lone_surrogate_in_an_unknown_field_is_a_json_422(client, raw):
    r = post_raw(client, "/tracin", raw)
    assert r.status_code == 422, r.text
    r.content.decode("utf-8")
    assert strict_json(r.text)["detail"]


@pytest.mark.parametrize("raw", ['{"vocab_file": "\\ud800"}', '{"\\udc00": 1}', '{"a": [{"b": "x\\udfffy"}]}'])
def test_a_lone_surrogate_in_a_free_form_config_is_422(client, model_dir, raw):
    r = post_raw(client, "/models/import", '{"name": "m", "kind": "nrms", "path": "' + model_dir + '", "config": '
                 + raw + "}")
    assert r.status_code == 422, r.text
    r.content.decode("utf-8")
    assert errors_at(r, ("body", "config")), r.text


# -------------------------------------------------------------------- bodies that are not JSON text (found by schemathesis)


@pytest.mark.parametrize("raw", [b"\xff\xfe\x00", b'{"model": "\xe9"}', b"\x15\xe3", b"[" * 5000 + b"]" * 5000])
@pytest.mark.parametrize("route", ["/tracin", "/datasets"])
def test_a_body_that_is_not_json_text_is_a_422_on_the_body(client, route, raw):
    """Not UTF-8, or nested deeper than the parser goes: FastAPI answered 400 with a bare string; now the
    validation shape, like any other JSON error."""
    r = client.post(route, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    (error,) = strict_json(r.text)["detail"]
    assert error["loc"] == ["body"] and error["type"] == "json_invalid", error


def test_operations_doc_lists_every_limit_with_its_default():
    from core.limits import LIMITS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip() for line in doc.splitlines()
            if line.startswith("| `MAX_")}
    assert {name: f"{limit.value:,}" for name, limit in LIMITS.items()} == rows
    assert "EXPLAINQ_WORKER_MEMORY_BYTES" in doc
