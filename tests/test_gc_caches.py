"""``explainq gc`` on a worker host keeps its local copies of store objects that still exist (issue 38, part 4).

Two hosts share Redis and a store; each has its own home, so its own cache (``EXPLAINQ_STORE_CACHE=always`` makes
the local directory store behave like an object store: every read goes through the host's cache).
"""

from __future__ import annotations

import json

from core import registry
from core.filestore import Store, get_store
from core.retention import collect
from core.settings import Settings


def _host(tmp_path, redis_server, name: str) -> Settings:
    return Settings(EXPLAINQ_HOME=str(tmp_path / name), REDIS_URL=redis_server.url,
                    EXPLAINQ_STORE=str(tmp_path / "shared-store"), EXPLAINQ_STORE_CACHE="always")


def _counting_downloads(store: Store, monkeypatch) -> list[str]:
    """Record every file the store copies to this host."""
    downloads: list[str] = []
    get_file = store.fs.get_file

    def counted(rpath, lpath, *args, **kwargs):
        downloads.append(rpath)
        return get_file(rpath, lpath, *args, **kwargs)

    monkeypatch.setattr(store.fs, "get_file", counted)
    return downloads


def _segment(tmp_path, name: str):
    seg = tmp_path / "src" / name
    seg.mkdir(parents=True)
    (seg / "features.npy").write_bytes(b"phi")
    (seg / "gram.npy").write_bytes(b"gram")
    return seg


def _setup(tmp_path, redis_server):
    """A registered model and a stored featurize segment for it, both read once on worker host B."""
    import redis as redis_lib

    redis_lib.Redis.from_url(redis_server.url).flushdb()
    api, worker = _host(tmp_path, redis_server, "api"), _host(tmp_path, redis_server, "worker")
    src = tmp_path / "src" / "model"
    src.mkdir(parents=True)
    (src / "size.json").write_text(json.dumps({"n": 1}))
    registry.register_model(api, "m", kind="test", loader="tests.test_store_gc:load_tensor_model", path=src)
    location = registry.get_model(api, "m")["location"]
    shared = get_store(api)
    shared.put_dir(_segment(tmp_path, "seg"), "features/fkey/digest-0")
    shared.put_bytes(json.dumps([location]).encode(), "features/fkey/models.json")
    store = get_store(worker)
    assert store.cache_dir != shared.cache_dir
    store.local_dir(location)
    store.local_dir("features/fkey/digest-0")
    return api, worker, store, location


def test_gc_keeps_cached_copies_of_objects_still_in_the_store(tmp_path, redis_server, monkeypatch):
    _api, worker, store, location = _setup(tmp_path, redis_server)
    cached = {location, "features/fkey/digest-0"}
    assert all((store.cache_dir / key / ".complete").is_file() for key in cached)

    first = collect(worker)
    assert first["cache"] == []
    assert all((store.cache_dir / key / ".complete").is_file() for key in cached)

    downloads = _counting_downloads(store, monkeypatch)
    second = collect(worker)
    assert not any(second.values()), second
    for key in cached:
        assert (store.local_dir(key) / ".complete").is_file()
    assert downloads == []  # gc twice in a row, then the next job's reads: nothing fetched again


def test_gc_drops_cached_copies_whose_object_left_the_store(tmp_path, redis_server):
    """Another host deleted the objects (its own gc, a replaced version past its grace period): this host's copies
    go at its next gc, and only those."""
    api, worker, store, location = _setup(tmp_path, redis_server)
    shared = get_store(api)
    shared.put_dir(_segment(tmp_path, "seg2"), "features/fkey/digest-1")
    store.local_dir("features/fkey/digest-1")

    shared.delete("features/fkey/digest-0")  # gone from the store; host B's copy is not evicted by this
    assert (store.cache_dir / "features/fkey/digest-0" / ".complete").is_file()
    assert collect(worker)["cache"] == ["features/fkey/digest-0"]
    assert not (store.cache_dir / "features/fkey/digest-0").exists()
    assert (store.cache_dir / "features/fkey/digest-1" / ".complete").is_file()
    assert (store.cache_dir / location / ".complete").is_file()

    # a model version replaced and then deleted from the store (by retention on another host)
    registry.unregister(api, "models", "m")
    assert collect(worker, grace_s=3600)["cache"] == []  # released, still stored: a job may still be loading it
    assert (store.cache_dir / location / ".complete").is_file()
    shared.delete(location)
    assert location in collect(worker)["cache"]
    assert not (store.cache_dir / location).exists()
