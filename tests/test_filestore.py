"""The shared file store (core/filestore.py), each test run on a local directory, on an fsspec memory:// store and
on a real S3 server (moto's, started by the tests, through s3fs).

A local directory is the default store and stands for a shared mount; memory:// and s3:// are object stores: no real
directories, no rename, and every read goes through this host's cache. The s3 runs are skipped, saying why, where
moto's server or s3fs is not installed (both are in the ``dev`` extra).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import fsspec
import pytest

from core import filestore
from core.filestore import Store, StoreError, clean_key, get_store, media_type, new_version

KEY = "models/m/20240101T000000-0123456789ab"


@pytest.fixture(params=["local", "memory", "s3"])
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """moto's S3 server on a free local port for the whole session, with test credentials and its address in the
    environment (AWS_ENDPOINT_URL, which botocore and so s3fs read); the environment is restored afterwards."""
    moto_server = pytest.importorskip("moto.server", reason="moto's server is not installed (pip install -e .[dev])")
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e .[dev], or explainq[s3])")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}.items():
            mp.setenv(name, value)
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture
def store_url(backend, tmp_path, request) -> Iterator[str]:
    """The store's URL: a directory under tmp_path, a memory:// root of this test's own (the memory file
    system is one per process, so each test gets a fresh root and empties it afterwards), or a fresh bucket on
    moto's S3 server."""
    if backend == "local":
        yield str(tmp_path / "store")
        return
    if backend == "s3":
        request.getfixturevalue("s3_server")
        fs = fsspec.filesystem("s3")
        bucket = f"explainq-test-{uuid.uuid4().hex[:12]}"
        fs.mkdir(bucket)
        yield f"s3://{bucket}/store"
        fs.rm(bucket, recursive=True)
        return
    root = f"/explainq-test-{uuid.uuid4().hex}"
    yield f"memory://{root}"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)
    left = [p for p in [*fs.store, *fs.pseudo_dirs] if p == root or p.startswith(root + "/")]
    assert not left, f"memory store not emptied: {left}"


@pytest.fixture
def store(store_url, tmp_path) -> Store:
    """The store as the default settings open it (cache mode auto)."""
    return Store(store_url, tmp_path / "cache")


@pytest.fixture
def other_host(store_url, tmp_path) -> Store:
    """The same store seen from a second host that copies what it reads into its own cache."""
    return Store(store_url, tmp_path / "hostB" / "cache", cache_mode="always")


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def everything_under_root(store: Store) -> list[str]:
    """Every path in the store, temporary ones included (which the store's own listings hide)."""
    return sorted(store.fs.find(store.root, withdirs=True))


# ---------------------------------------------------------------------------------------------------- writing
def test_put_dir_then_read_back(store, tmp_path):
    blob = bytes(range(256)) * 4
    src = tree(tmp_path / "src", {"config.json": '{"a": 1}', "sub/x.txt": "hello", "sub/deep/w.bin": blob})
    store.put_dir(src, KEY)
    assert store.exists(KEY) and store.isdir(KEY)
    assert store.exists(f"{KEY}/sub/x.txt") and not store.isdir(f"{KEY}/sub/x.txt")
    assert store.isdir(f"{KEY}/sub")
    assert not store.exists("models/m/other") and not store.exists(f"{KEY}/nope.txt")
    assert store.read_text(f"{KEY}/config.json") == '{"a": 1}'
    assert store.read_bytes(f"{KEY}/sub/deep/w.bin") == blob
    assert store.size(f"{KEY}/sub/deep/w.bin") == 1024
    with store.open(f"{KEY}/sub/x.txt") as fh:
        assert fh.read() == b"hello"
    chunks = list(store.iter_bytes(f"{KEY}/sub/deep/w.bin", chunk=100))
    assert b"".join(chunks) == blob and [len(c) for c in chunks] == [100] * 10 + [24]


def test_put_dir_needs_a_local_directory(store, tmp_path):
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file", tmp_path / "missing"):
        with pytest.raises(StoreError, match="not a directory"):
            store.put_dir(bad, KEY)
    assert not store.exists(KEY)


def snapshot(store: Store) -> dict[str, bytes | None]:
    """Every path in the store with its content (None for a directory; an object store's directories are only
    prefixes of its keys, which its client lists or not by what it has cached, so only its files count)."""
    store.fs.invalidate_cache()
    return {p: None if store.fs.isdir(p) else store.fs.cat_file(p) for p in everything_under_root(store)
            if store.local or not store.fs.isdir(p)}


@pytest.mark.parametrize("occupant", ["version", "file", "empty directory"])
def test_a_version_key_that_exists_is_refused(backend, store, tmp_path, occupant):
    """Versions are immutable: a second upload to a key that holds anything is refused and changes nothing
    (neither replaced, nor merged into, nor a staging copy left behind)."""
    if occupant == "empty directory" and backend == "s3":
        pytest.skip("S3 has no empty directories: a key holds an object or is the prefix of one")
    if occupant == "version":
        store.put_dir(tree(tmp_path / "first", {"config.json": "1", "w.bin": "old"}), KEY)
    elif occupant == "file":
        store.put_bytes(b"not a version", KEY)
    else:
        store.fs.makedirs(store.full(KEY), exist_ok=True)
    before = snapshot(store)
    with pytest.raises(StoreError, match="already exists"):
        store.put_dir(tree(tmp_path / "second", {"config.json": "2", "extra.txt": "new"}), KEY)
    assert snapshot(store) == before


def test_a_version_another_host_writes_during_the_upload_is_refused(backend, store, tmp_path, monkeypatch):
    """On a file system the rename itself refuses a key that appeared after the check (another host won)."""
    if backend != "local":
        pytest.skip("no rename on this backend: the check before the upload is not atomic (see Store.put_dir)")
    theirs = tree(tmp_path / "theirs", {"config.json": "theirs"})
    rename = os.rename

    def another_host_wins(src_path, dst_path):
        if dst_path == store.full(KEY):
            shutil.copytree(theirs, dst_path)
        return rename(src_path, dst_path)

    monkeypatch.setattr(filestore.os, "rename", another_host_wins)
    with pytest.raises(StoreError, match="already exists"):
        store.put_dir(tree(tmp_path / "ours", {"config.json": "ours", "extra.txt": "x"}), KEY)
    assert store.list_files(KEY) == [{"name": "config.json", "size": 6, "media_type": "application/json"}]
    assert store.read_text(f"{KEY}/config.json") == "theirs"
    assert not [p for p in everything_under_root(store) if ".tmp-" in p]  # our staging copy is gone


def test_a_failed_upload_keeps_its_error_and_leaves_nothing(backend, store, tmp_path, monkeypatch):
    if backend != "local":
        pytest.skip("no staging on this backend: the files sent stay under a key nothing names")

    def rename_fails(src_path, dst_path):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(filestore.os, "rename", rename_fails)
    with pytest.raises(OSError, match="cross-device") as caught:
        store.put_dir(tree(tmp_path / "src", {"config.json": "{}"}), KEY)
    assert not isinstance(caught.value, StoreError)  # not mistaken for an existing version
    assert not store.exists(KEY) and not [p for p in everything_under_root(store) if ".tmp-" in p]


def test_put_file_and_put_bytes_replace_single_files(store, tmp_path):
    """Unlike versions, single files (a job's growing artifacts, a shard's done.json) are replaced."""
    local = tmp_path / "influence.csv"
    local.write_text("a,b\n")
    store.put_file(local, "artifacts/j/influence.csv")
    assert store.read_text("artifacts/j/influence.csv") == "a,b\n"
    local.write_text("a,b\n1,2\n")
    store.put_file(local, "artifacts/j/influence.csv")
    assert store.read_text("artifacts/j/influence.csv") == "a,b\n1,2\n"
    store.put_bytes(b"{}", "artifacts/j/done.json")
    store.put_bytes(b'{"n": 1}', "artifacts/j/done.json")
    assert store.read_bytes("artifacts/j/done.json") == b'{"n": 1}'
    assert store.list_files("artifacts/j") == [
        {"name": "done.json", "size": 8, "media_type": "application/json"},
        {"name": "influence.csv", "size": 8, "media_type": "text/csv"}]
    assert not [p for p in everything_under_root(store) if ".tmp-" in p]  # no temporary name left behind


def test_a_single_file_is_invisible_until_complete(backend, store, tmp_path, monkeypatch):
    """On a file system a file is written under a temporary name and renamed: at no moment does the key hold
    part of it. (An object store's single PUT shows the object whole or not at all; memory:// too.)"""
    if backend != "local":
        pytest.skip("no rename on this backend: one PUT is atomic by itself")
    key = "artifacts/j/out.txt"
    store.put_bytes(b"old", key)
    seen = []
    replace = os.replace

    def observing_replace(src, dst):
        seen.append((store.read_bytes(key), [f["name"] for f in store.list_files("artifacts/j")]))
        return replace(src, dst)

    monkeypatch.setattr(filestore.os, "replace", observing_replace)
    store.put_bytes(b"new content", key)
    local = tmp_path / "f"
    local.write_text("newer content")
    store.put_file(local, key)
    assert seen == [(b"old", ["out.txt"]), (b"new content", ["out.txt"])]
    assert store.read_bytes(key) == b"newer content"


def test_a_directory_is_invisible_until_complete(backend, store, tmp_path, monkeypatch):
    """On a file system put_dir copies into a staging directory and renames it: until the rename the version
    key does not exist, and the staging copy is hidden from listings (as from retention, which lists them)."""
    if backend != "local":
        pytest.skip("no rename on this backend: a version is read only once the registry names it")
    src = tree(tmp_path / "src", {"config.json": "{}", "sub/w.bin": b"\0" * 10})
    seen = []
    rename = os.rename

    def observing_rename(src_path, dst_path):
        seen.append((store.exists(KEY), store.list_dirs("models/m"), store.list_files("models/m"),
                     sorted(p.name for p in Path(src_path).rglob("*"))))
        return rename(src_path, dst_path)

    monkeypatch.setattr(filestore.os, "rename", observing_rename)
    store.put_dir(src, KEY)
    assert seen == [(False, [], [], ["config.json", "sub", "w.bin"])]  # complete, before it appears
    assert [f["name"] for f in store.list_files(KEY)] == ["config.json", "sub/w.bin"]


def test_sync_dir_sends_only_files_changed_since_the_last_call(store, tmp_path, monkeypatch):
    src = tmp_path / "job"
    src.mkdir()
    (src / "a.txt").write_text("1")
    (src / "b.txt").write_text("2")
    sent: list[str] = []
    put = store.put_file
    monkeypatch.setattr(store, "put_file", lambda path, key: (sent.append(key), put(path, key)))
    uploaded: dict = {}
    store.sync_dir(src, "artifacts/j", uploaded)
    store.sync_dir(src, "artifacts/j", uploaded)  # nothing changed: nothing sent
    assert sent == ["artifacts/j/a.txt", "artifacts/j/b.txt"]
    (src / "b.txt").write_text("22")
    os.utime(src / "b.txt", ns=(1, 10**18))
    store.sync_dir(src, "artifacts/j", uploaded)
    assert sent[2:] == ["artifacts/j/b.txt"] and store.read_text("artifacts/j/b.txt") == "22"


def test_sync_dir_skips_files_still_being_written(store, tmp_path):
    src = tree(tmp_path / "job", {"done.csv": "1", "sub/ok.jsonl": "{}", "part.csv.tmp": "x",
                                  "sub/w.bin.tmp-0123abcd": "x"})
    store.sync_dir(src, "artifacts/j")
    assert [f["name"] for f in store.list_files("artifacts/j")] == ["done.csv", "sub/ok.jsonl"]
    store.sync_dir(tmp_path / "no-such-dir", "artifacts/k")  # a job that wrote nothing: nothing to do
    assert not store.exists("artifacts/k")


# ---------------------------------------------------------------------------------------------------- listing
def test_list_files_gives_names_sizes_and_media_types(store, tmp_path):
    src = tree(tmp_path / "src", {"b.txt": "hi", "a.csv": "x,y\n", "sub/deep/w.safetensors": b"\0" * 10,
                                  "sub/z.weird-suffix": b"\1" * 3})
    store.put_dir(src, "datasets/d/v1")
    store.put_bytes(b"other", "datasets/d/v10/b.txt")  # a sibling whose name starts the same
    assert store.list_files("datasets/d/v1") == [
        {"name": "a.csv", "size": 4, "media_type": "text/csv"},
        {"name": "b.txt", "size": 2, "media_type": "text/plain"},
        {"name": "sub/deep/w.safetensors", "size": 10, "media_type": media_type("w.safetensors")},
        {"name": "sub/z.weird-suffix", "size": 3, "media_type": "application/octet-stream"}]
    assert store.list_files("datasets/d/none") == []
    assert store.list_files("datasets/d/v1/b.txt") == []  # a file has no files under it


def test_listings_hide_staging_copies(store, tmp_path):
    src = tree(tmp_path / "src", {"config.json": "{}"})
    store.put_dir(src, "models/m/v1")
    store.put_dir(src, "models/m/v2")
    store.put_bytes(b"x", "models/m/notes.txt")
    store.put_bytes(b"x", "models/m/v3.tmp-0123abcd/config.json")  # an upload still in progress
    assert store.list_dirs("models/m") == ["v1", "v2"]
    assert store.list_dirs("models") == ["m"]
    assert store.list_dirs("models/none") == []
    assert [f["name"] for f in store.list_files("models/m")] == ["notes.txt", "v1/config.json", "v2/config.json"]


# ---------------------------------------------------------------------------------------------------- reading
def test_missing_keys(store):
    with pytest.raises(StoreError, match="no 'a/b.txt'"):
        store.read_bytes("a/b.txt")
    with pytest.raises(StoreError):
        store.read_text("a/b.txt")
    with pytest.raises(StoreError):
        store.local_dir("a")
    with pytest.raises(FileNotFoundError):  # the artifact download route maps this to a 404
        store.size("a/b.txt")
    with pytest.raises(FileNotFoundError):
        store.open("a/b.txt").read()
    assert not store.exists("a") and not store.isdir("a")


def test_local_dir_reads_a_file_system_store_in_place_and_copies_any_other(backend, store, store_url, tmp_path):
    src = tree(tmp_path / "src", {"config.json": "{}", "sub/x.txt": "hello"})
    store.put_dir(src, KEY)
    local = store.local_dir(KEY)
    assert (local / "sub" / "x.txt").read_text() == "hello"
    if backend == "local":
        assert store.in_place and local == Path(store_url) / KEY  # the store's own files, no copy
        assert not (tmp_path / "cache").exists()
    else:
        assert not store.in_place and local == tmp_path / "cache" / KEY
        assert (local / ".complete").read_text() == KEY
        assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()) == [
            ".complete", "config.json", "sub/x.txt"]


def test_another_host_reads_a_version_from_its_own_cache(store, other_host, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.txt").write_text("hello")
    store.put_dir(src, "models/m/v1")
    local = other_host.local_dir("models/m/v1")
    assert local.is_relative_to(tmp_path / "hostB" / "cache")
    assert (local / "sub" / "x.txt").read_text() == "hello"
    assert other_host.local_dir("models/m/v1") == local  # reused
    assert other_host.list_files("models/m/v1") == [{"name": "sub/x.txt", "size": 5, "media_type": "text/plain"}]
    with pytest.raises(StoreError):
        other_host.local_dir("models/m/none")
    assert not [p for p in (tmp_path / "hostB" / "cache").rglob("*") if ".tmp-" in p.name]


def test_a_cached_copy_is_made_once_even_for_concurrent_callers(store, other_host, tmp_path, monkeypatch):
    src = tree(tmp_path / "src", {"a.txt": "1", "b.txt": "2", "sub/c.txt": "3"})
    store.put_dir(src, KEY)
    fetched: list[str] = []
    get_file = other_host.fs.get_file

    def slow_get_file(rpath, lpath, **kwargs):
        fetched.append(rpath)
        time.sleep(0.02)  # widen the window in which a second copy could start
        return get_file(rpath, lpath, **kwargs)

    monkeypatch.setattr(other_host.fs, "get_file", slow_get_file)
    with ThreadPoolExecutor(6) as pool:
        paths = set(pool.map(lambda _: other_host.local_dir(KEY), range(6)))
    assert paths == {tmp_path / "hostB" / "cache" / KEY}
    assert len(fetched) == 3
    assert other_host.local_dir(KEY) == paths.pop() and len(fetched) == 3  # and later calls copy nothing


def test_a_partial_cached_copy_is_redone(store, other_host, tmp_path):
    """A copy without its completion marker (a host crashed while copying) is replaced by a whole one."""
    store.put_dir(tree(tmp_path / "src", {"a.txt": "1"}), KEY)
    dest = tmp_path / "hostB" / "cache" / KEY
    tree(dest, {"half-copied.bin": "x"})
    assert other_host.local_dir(KEY) == dest
    assert sorted(p.name for p in dest.iterdir()) == [".complete", "a.txt"]


def test_a_failed_copy_leaves_nothing_in_the_cache(store, other_host, tmp_path, monkeypatch):
    """The network goes away after the first file and stays away: every retry fails, the copy is given up as
    StoreUnavailable, and nothing is left in the cache; once the network is back the copy is made whole."""
    store.put_dir(tree(tmp_path / "src", {"a.txt": "1", "b.txt": "2"}), KEY)
    get_file = other_host.fs.get_file
    calls = []

    def failing_get_file(rpath, lpath, **kwargs):
        calls.append(rpath)
        if len(calls) >= 2:
            raise ConnectionError("network went away")
        return get_file(rpath, lpath, **kwargs)

    monkeypatch.setattr(other_host.fs, "get_file", failing_get_file)
    other_host.backoff_s = 0.01
    with pytest.raises(filestore.StoreUnavailable, match="ConnectionError"):
        other_host.local_dir(KEY)
    assert len(calls) == 2 + other_host.retries  # the first file, then the second one's attempts
    assert not [p for p in (tmp_path / "hostB" / "cache").rglob("*") if p.is_file()]
    monkeypatch.undo()
    assert sorted(p.name for p in other_host.local_dir(KEY).iterdir()) == [".complete", "a.txt", "b.txt"]


def test_a_copy_rides_out_a_brief_outage(store, other_host, tmp_path, monkeypatch):
    """One failed transfer is retried: the copy completes."""
    store.put_dir(tree(tmp_path / "src", {"a.txt": "1", "b.txt": "2"}), KEY)
    get_file = other_host.fs.get_file
    calls = []

    def flaky_get_file(rpath, lpath, **kwargs):
        calls.append(rpath)
        if len(calls) == 2:
            raise ConnectionError("network went away")
        return get_file(rpath, lpath, **kwargs)

    monkeypatch.setattr(other_host.fs, "get_file", flaky_get_file)
    other_host.backoff_s = 0.01
    assert sorted(p.name for p in other_host.local_dir(KEY).iterdir()) == [".complete", "a.txt", "b.txt"]
    assert len(calls) == 3


def test_a_copy_finished_first_by_another_process_is_kept(store, other_host, tmp_path, monkeypatch):
    """Two processes copying one key: the loser's rename fails, it drops its staging copy and uses the winner's."""
    store.put_dir(tree(tmp_path / "src", {"a.txt": "1"}), KEY)
    dest = tmp_path / "hostB" / "cache" / KEY
    rename = os.rename

    def another_process_wins(src_path, dst_path):
        if Path(dst_path) == dest:
            shutil.copytree(src_path, dest)  # the other process's complete copy lands first
        return rename(src_path, dst_path)

    monkeypatch.setattr(filestore.os, "rename", another_process_wins)
    assert other_host.local_dir(KEY) == dest
    assert sorted(p.name for p in dest.iterdir()) == [".complete", "a.txt"]
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]  # no staging copy left


# ---------------------------------------------------------------------------------------------------- deleting
def test_delete_removes_the_key_and_this_hosts_copy(store, other_host, tmp_path):
    src = tree(tmp_path / "src", {"a.txt": "1"})
    store.put_dir(src, "models/m/v1")
    store.put_dir(src, "models/m/v2")
    store.put_bytes(b"x", "artifacts/j/out.txt")
    cached = other_host.local_dir("models/m/v1")
    other_host.delete("models/m/v1")
    assert not store.exists("models/m/v1") and not cached.exists()
    assert store.list_dirs("models/m") == ["v2"] and store.read_text("models/m/v2/a.txt") == "1"
    other_host.delete("models/m/v1")  # already gone: nothing to do
    store.delete("artifacts/j/out.txt")
    assert not store.exists("artifacts/j/out.txt")
    with pytest.raises(StoreError):
        other_host.local_dir("models/m/v1")


def test_evict_drops_only_this_hosts_copy(store, other_host, tmp_path):
    store.put_dir(tree(tmp_path / "src", {"a.txt": "1"}), KEY)
    cached = other_host.local_dir(KEY)
    other_host.evict(KEY)
    assert not cached.exists() and store.exists(f"{KEY}/a.txt")
    assert (other_host.local_dir(KEY) / "a.txt").read_text() == "1"  # copied again on demand


# ---------------------------------------------------------------------------------------------------- keys
@pytest.mark.parametrize(("parts", "key"), [
    (("models", "m", "v1"), "models/m/v1"),
    (("/models/", "/m/v1/"), "models/m/v1"),
    (("a//b",), "a/b"),
    (("a/./b",), "a/b"),
    (("a/x/../b",), "a/b"),
    (("", "a", "/"), "a"),
    (("/etc/passwd",), "etc/passwd"),  # an absolute part is taken as relative: it stays inside the store
    (("...",), "..."),
])
def test_clean_key_joins_parts_into_a_relative_key(parts, key):
    assert clean_key(*parts) == key


@pytest.mark.parametrize("parts", [("..",), ("../x",), ("a/../../x",), ("a", "..", ".."), ("a/..",), (".",),
                                   ("a\x00b",), ("",), ("/",), ("", "//"), ()])
def test_clean_key_refuses_keys_that_escape_or_name_nothing(parts):
    with pytest.raises(StoreError, match="invalid store key"):
        clean_key(*parts)


@pytest.mark.parametrize("key", ["..", "../escape", "a/../../escape", "", "/"])
def test_no_store_method_reaches_outside_the_store(store, tmp_path, key):
    """Every key that leaves the store or names nothing (its root included) is refused."""
    src = tree(tmp_path / "src", {"a.txt": "1"})
    calls = [store.full, store.exists, store.isdir, store.read_bytes, store.read_text, store.open, store.size,
             store.list_files, store.list_dirs, store.local_dir, store.delete, store.evict,
             lambda k: store.put_bytes(b"x", k), lambda k: store.put_file(src / "a.txt", k),
             lambda k: store.put_dir(src, k)]
    if key.strip("/"):  # sync_dir's key is a prefix of the names it writes: "" is the root, which is fine
        calls.append(lambda k: store.sync_dir(src, k))
    for call in calls:
        with pytest.raises(StoreError, match="invalid store key"):
            call(key)
    assert sorted(p.name for p in tmp_path.iterdir()) in (["src"], ["src", "store"])  # nothing beside it
    assert everything_under_root(store) in ([], [store.root])  # nor in it


def test_an_absolute_key_stays_inside_the_store(store):
    store.put_bytes(b"x", "/artifacts/j/out.txt")
    assert store.full("/artifacts/j/out.txt") == store.full("artifacts/j/out.txt")
    assert store.full("artifacts/j/out.txt").startswith(store.root + "/")
    assert store.read_bytes("artifacts/j/out.txt") == b"x"


def test_versions_are_unique_and_sort_by_time():
    versions = [new_version() for _ in range(200)]
    assert len(set(versions)) == 200
    assert all(re.fullmatch(r"\d{8}T\d{6}-[0-9a-f]{12}", v) for v in versions)
    assert sorted(versions, key=lambda v: v[:15]) == versions  # the timestamp part never goes backwards
    assert new_version()[:15] >= versions[-1][:15]


def test_media_types(monkeypatch):
    assert media_type("a.csv") == "text/csv" and media_type("a.txt") == "text/plain"
    assert media_type("no-suffix") == "application/octet-stream"
    monkeypatch.setattr(filestore.mimetypes, "guess_type", lambda name: (None, None))  # a host that knows none
    assert media_type("a.JSONL") == "application/x-ndjson"
    assert media_type("a.tsv") == "text/tab-separated-values" and media_type("a.csv") == "text/csv"
    assert media_type("w.safetensors") == media_type("x.npy") == "application/octet-stream"
    assert media_type("a.weird-suffix") == "application/octet-stream"


# ---------------------------------------------------------------------------------------------------- opening
def test_only_a_file_system_store_is_read_in_place(backend, store_url, tmp_path):
    assert Store(store_url, tmp_path / "c").in_place == (backend == "local")
    assert not Store(store_url, tmp_path / "c", cache_mode="always").in_place
    with pytest.raises(ValueError, match="'auto' or 'always'"):
        Store(store_url, tmp_path / "c", cache_mode="never")


def test_get_store_keeps_one_store_per_url_cache_mode_and_bounds(store_url, tmp_path, monkeypatch):
    monkeypatch.setattr(filestore, "_STORES", {})

    def settings(cache: str, mode: str = "auto", timeout_s: float = 30.0, retries: int = 3) -> SimpleNamespace:
        return SimpleNamespace(store_url=store_url, store_cache_dir=tmp_path / cache, store_cache_mode=mode,
                               store_timeout_s=timeout_s, store_retries=retries)

    first = get_store(settings("c"))
    assert first.url == store_url and first.cache_dir == tmp_path / "c"
    assert (first.timeout_s, first.retries) == (30.0, 3)
    assert get_store(settings("c")) is first
    assert get_store(settings("other")) is not first
    assert get_store(settings("c", "always")) is not first
    assert get_store(settings("c", timeout_s=5.0)).timeout_s == 5.0
    assert get_store(settings("c", retries=0)).retries == 0
