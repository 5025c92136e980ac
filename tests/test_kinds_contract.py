"""Every registered job kind honours the submission contract: bad input is a 422 naming the field, never a 500."""

from __future__ import annotations

import pytest

from core.contract.kind import load_kinds as load_all
from tests.service import api_client

PRODUCT_KINDS = {name: kind for name, kind in load_all().items()
                 if not kind.func.startswith("tests.") and not kind.internal}
WRONG_VALUES = [{"nested": ["wrong"]}, -10**12, "definitely-not-valid-\u2603", [None], None]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with api_client(tmp_path_factory.mktemp("contract")) as c:
        yield c


def test_product_kinds_are_registered_on_both_queues():
    queues = {kind.queue for kind in PRODUCT_KINDS.values()}
    assert queues <= {"explain", "bulk", "train"}  # bulk: evaluations whose work is a fan-out of trainings
    for kind in PRODUCT_KINDS.values():
        assert kind.func.startswith("workers.jobs."), kind.func
        assert kind.timeout_s > 0


@pytest.mark.parametrize("name", sorted(PRODUCT_KINDS))
def test_unknown_field_is_422_naming_it(client, name):
    r = client.post(PRODUCT_KINDS[name].route, json={"no_such_field": 1})
    assert r.status_code == 422, r.text
    unknown = [d for d in r.json()["detail"] if tuple(d["loc"]) == ("body", "no_such_field")]
    assert [d["type"] for d in unknown] == ["extra_forbidden"], r.text


def _objects(schema: dict, defs: dict, path: str = "body"):
    """Every object schema with properties in a request schema, nested models and list items included."""
    if "$ref" in schema:
        yield from _objects(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, path)
        return
    if schema.get("properties"):
        yield path, schema
        for name, prop in schema["properties"].items():
            yield from _objects(prop, defs, f"{path}.{name}")
    for key in ("anyOf", "oneOf", "allOf"):
        for alt in schema.get(key, []):
            yield from _objects(alt, defs, path)
    if isinstance(schema.get("items"), dict):
        yield from _objects(schema["items"], defs, path + "[]")


@pytest.mark.parametrize("name", sorted(PRODUCT_KINDS))
def test_every_nested_object_refuses_unknown_fields(name):
    """A typo in a nested object (a sample, a model spec) is an error, not a silently ignored field."""
    schema = PRODUCT_KINDS[name].request.model_json_schema()
    objects = list(_objects(schema, schema.get("$defs", {})))
    assert objects
    lax = [path for path, obj in objects if obj.get("additionalProperties") is not False]
    assert lax == []


@pytest.mark.parametrize("name", sorted(PRODUCT_KINDS))
def test_wrong_values_never_give_5xx(client, name):
    kind = PRODUCT_KINDS[name]
    fields = kind.request.model_json_schema().get("properties", {})
    assert fields, name
    for field in fields:
        for value in WRONG_VALUES:
            r = client.post(kind.route, json={field: value})
            assert r.status_code in (202, 422), (name, field, value, r.status_code, r.text)
            if r.status_code == 422:
                detail = r.json()["detail"]
                assert isinstance(detail, list) and all("loc" in d and "msg" in d for d in detail)
