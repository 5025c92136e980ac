"""core/results.py: a result over ``EXPLAINQ_RESULT_INLINE_BYTES`` goes to the store and Redis keeps a pointer with
its size and SHA-256; a small one stays inline; reading follows the pointer and checks it (the service-level
lifetime tests are in tests/test_keep_delete.py)."""

from __future__ import annotations

import math

import pytest

from core import results
from core.filestore import get_store
from core.settings import Settings


@pytest.fixture
def settings(tmp_path):
    return Settings(EXPLAINQ_HOME=str(tmp_path), EXPLAINQ_RESULT_INLINE_BYTES=100)


def test_a_small_result_stays_inline_and_a_large_one_goes_to_the_store(settings):
    small = {"ok": 1}
    assert results.keep(settings, "a" * 32, small) is small
    assert not get_store(settings).exists(results.result_key("a" * 32))
    large = {"rows": [{"i": i, "score": i / 7} for i in range(50)]}
    held = results.keep(settings, "b" * 32, large)
    assert results.is_pointer(held) and held[results.POINTER]["bytes"] == len(results.encode(large))
    assert len(results.encode(held)) < 128 < len(results.encode(large))
    assert results.resolve(settings, "b" * 32, held) == large
    assert results.resolve(settings, "a" * 32, small) is small
    assert results.stored_ids(settings) == ["b" * 32]


def test_the_inline_bound_is_inclusive_and_zero_stores_everything(tmp_path):
    value = {"x": "y" * 10}
    size = len(results.encode(value))
    at = Settings(EXPLAINQ_HOME=str(tmp_path), EXPLAINQ_RESULT_INLINE_BYTES=size)
    assert results.keep(at, "c" * 32, value) is value
    under = Settings(EXPLAINQ_HOME=str(tmp_path), EXPLAINQ_RESULT_INLINE_BYTES=size - 1)
    assert results.is_pointer(results.keep(under, "c" * 32, value))
    zero = Settings(EXPLAINQ_HOME=str(tmp_path), EXPLAINQ_RESULT_INLINE_BYTES=0)
    assert results.is_pointer(results.keep(zero, "d" * 32, {}))


def test_a_non_finite_number_reads_back_as_null(settings):
    held = results.keep(settings, "e" * 32, {"v": [math.nan] * 40})
    assert results.resolve(settings, "e" * 32, held) == {"v": [None] * 40}


def test_a_pointer_is_checked_against_the_file(settings):
    large = {"rows": list(range(100))}
    held = results.keep(settings, "f" * 32, large)
    store = get_store(settings)
    data = store.read_bytes(results.result_key("f" * 32))
    store.put_bytes(data.replace(b"99", b"98"), results.result_key("f" * 32))  # same size, other content
    with pytest.raises(results.StoredResultError) as corrupt:
        results.resolve(settings, "f" * 32, held)
    assert corrupt.value.code == "result_corrupt"
    results.delete(settings, "f" * 32)
    with pytest.raises(results.StoredResultError) as missing:
        results.resolve(settings, "f" * 32, held)
    assert missing.value.code == "result_missing" and str(settings.home) not in missing.value.message


def test_a_dict_that_merely_looks_like_a_pointer_is_a_pointer_only_in_its_exact_shape():
    assert not results.is_pointer({results.POINTER: {"bytes": 1}, "other": 1})
    assert not results.is_pointer({results.POINTER: "x"})
    assert not results.is_pointer([results.POINTER])
