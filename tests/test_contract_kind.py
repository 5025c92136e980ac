"""The kind contract itself (``core.contract.kind``): a fan-out declared on the kind registers typed shard and
reduce kinds, a declaration naming a field the request lacks is refused, shard payloads planned by earlier
versions still validate, and the kind table is loaded by one function, the plugin hooks once each."""

from __future__ import annotations

import pytest
from pydantic import Field

from core.contract import kind as contract
from core.contract.fields import JobRequest
from core.contract.kind import FanOut, JobKind, ReduceRequest, ShardRequest, load_kinds
from core.contract.results.training import TrainingResult
from core.kinds.tracin import TracInRequest
from core.settings import Settings


class ItemsRequest(JobRequest):
    n: int = Field(4, ge=1, le=100)
    big: list[int] | None = Field(None, max_length=100)


def _kind(**fanout: object) -> JobKind:
    return JobKind(name="contract_items", route="/contract/items", request=ItemsRequest, queue="explain",
                   func="tests.test_contract_kind:nothing", renderer="training",
                   fanout=FanOut(unit="items", shard="tests.test_contract_kind:nothing",
                                 reduce="tests.test_contract_kind:nothing", timeout_s=60, **fanout))


def test_a_declared_fan_out_registers_typed_shard_and_reduce_kinds() -> None:
    kind = _kind(from_parent=("big",))
    contract.register(kind)
    try:
        shard, reduce = contract.KINDS["contract_items_shard"], contract.KINDS["contract_items_reduce"]
        assert shard.internal and reduce.internal and shard.queue == reduce.queue == "bulk"
        assert shard.timeout_s == reduce.timeout_s == 60
        assert kind.result is TrainingResult and reduce.result is TrainingResult  # the renderer's model
        typed = shard.request.model_validate({"parent": "p1", "index": 0, "start": 0, "end": 2,
                                              "request": {"n": 3}, "from_parent": ["big"]})
        assert isinstance(typed.request, ItemsRequest) and typed.request.n == 3
        with pytest.raises(ValueError):  # the parent's request is validated too
            shard.request.model_validate({"parent": "p1", "index": 0, "start": 0, "end": 2, "request": {"n": 0}})
        assert reduce.request.model_validate({"parent": "p1", "shards": 2, "request": {}}).request.n == 4
    finally:
        contract.unregister("contract_items")
    assert not {"contract_items", "contract_items_shard", "contract_items_reduce"} & set(contract.KINDS)


def test_a_fan_out_must_name_fields_of_its_request() -> None:
    with pytest.raises(ValueError, match="not a field"):
        _kind(from_parent=("test_triples",))


def test_a_shard_planned_by_an_earlier_version_still_validates() -> None:
    """Earlier versions marked the request ``test_triples_from_parent``: now ``from_parent``."""
    old = {"parent": "abc", "index": 1, "start": 0, "end": 10,
           "request": {"model": "m", "test_triples": None, "test_triples_from_parent": True}}
    shard = ShardRequest[TracInRequest].model_validate(old)
    assert shard.from_parent == ["test_triples"] and shard.request.test_triples is None
    reduce = ReduceRequest[TracInRequest].model_validate({k: v for k, v in old.items()
                                                         if k not in ("index", "start", "end")} | {"shards": 2})
    assert reduce.from_parent == ["test_triples"]


CALLS: list[str] = []


def count_hook() -> None:
    CALLS.append("called")


def test_the_kind_table_runs_each_plugin_hook_once() -> None:
    settings = Settings(EXPLAINQ_KIND_PLUGINS="tests.test_contract_kind:count_hook, ")
    table = load_kinds(settings)
    assert {"tracin", "attributions", "tracin_shard"} <= set(table)
    load_kinds(settings)
    assert CALLS == ["called"]
    assert contract.plugin_hooks(settings) == ["tests.test_contract_kind:count_hook"]
    with pytest.raises(ValueError, match="module:attribute"):
        contract.import_object("no-colon")


def nothing(*_: object) -> None:
    """A job function for the kinds above (never run)."""
