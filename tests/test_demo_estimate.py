"""The first start's remaining-time estimate (core/demo_status.py): planned step costs scaled by the pace measured
on this machine as steps end, an overdue running step never read as done, and each coming model's
``retry_after_s`` (the 503's ``Retry-After``) from the same estimate."""

from __future__ import annotations

import json

import pytest

from core import demo_status as ds

NOW = 10_000.0


def _plan(*steps):
    return json.dumps({"started_at": NOW - 1000, "steps": [
        {"name": name, "models": [f"{name}-model"], "datasets": [], "kinds": [f"{name}-kind"], "cost_s": cost,
         "state": state, "started_at": started, "ended_at": ended} for name, cost, state, started, ended in steps]})


def _status(*steps):
    return ds.interpret(_plan(*steps), True, NOW)


def test_before_any_step_ends_the_estimate_is_the_plan():
    status = _status(("a", 10.0, ds.PREPARING, NOW - 4, None), ("b", 20.0, ds.PENDING, None, None))
    assert status["eta_s"] == pytest.approx(6 + 20)
    coming = ds.coming(status, "models", NOW)
    assert coming["a-model"]["retry_after_s"] == 6 and coming["b-model"]["retry_after_s"] == 26
    assert coming["b-model"]["kinds"] == ["b-kind"] and coming["b-model"]["state"] == ds.PENDING


def test_a_slower_machine_than_planned_stretches_what_is_left_as_soon_as_a_step_ends():
    # a took 30 s where 10 were planned: the machine runs at a third of the plan's speed
    status = _status(("a", 10.0, ds.READY, NOW - 35, NOW - 5), ("b", 20.0, ds.PREPARING, NOW - 5, None),
                     ("c", 100.0, ds.PENDING, None, None))
    assert status["eta_s"] == pytest.approx((3 * 20 - 5) + 3 * 100)
    assert ds.coming(status, "models", NOW)["c-model"]["retry_after_s"] == 355
    faster = _status(("a", 10.0, ds.READY, NOW - 10, NOW - 5), ("b", 20.0, ds.PENDING, None, None))
    assert faster["eta_s"] == pytest.approx(10)  # twice as fast as planned


def test_an_overdue_step_is_never_read_as_done_and_its_estimate_grows_with_it():
    etas = []
    for elapsed in (20.0, 40.0, 80.0):
        status = _status(("a", 10.0, ds.PREPARING, NOW - elapsed, None), ("b", 5.0, ds.PENDING, None, None))
        etas.append(status["eta_s"])
        pace = elapsed / 10
        assert status["eta_s"] == pytest.approx(ds.OVERDUE_SHARE * elapsed + pace * 5)
    assert etas[0] < etas[1] < etas[2] and etas[0] > 0


def test_the_pace_is_bounded_and_retry_after_reaches_an_hour_not_five_minutes():
    status = _status(("a", 1.0, ds.READY, NOW - 1000, NOW - 900), ("b", 600.0, ds.PENDING, None, None))
    assert ds._pace(status["steps"], NOW) == ds.MAX_PACE
    assert ds.coming(status, "models", NOW)["b-model"]["retry_after_s"] == ds.MAX_RETRY_S == 3600
    quick = _status(("a", 100.0, ds.READY, NOW - 2, NOW - 1), ("b", 10.0, ds.PENDING, None, None))
    assert ds._pace(quick["steps"], NOW) == ds.MIN_PACE
    assert ds.coming(quick, "models", NOW)["b-model"]["retry_after_s"] == ds.MIN_RETRY_S


def test_a_failed_step_counts_toward_the_pace_and_a_dead_demo_promises_nothing():
    status = _status(("a", 10.0, ds.FAILED, NOW - 25, NOW - 5), ("b", 10.0, ds.PENDING, None, None))
    assert status["eta_s"] == pytest.approx(20)
    dead = ds.interpret(_plan(("a", 10.0, ds.PREPARING, NOW - 5, None)), False, NOW)
    assert dead["eta_s"] is None and ds.coming(dead, "models", NOW) == {}
