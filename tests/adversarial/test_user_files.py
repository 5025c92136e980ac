"""A tenant's files are a way in until the one opener closes it (core/userfiles.py).

Each test plays a hostile tenant who places files under the data roots (the normal way to bring data) and names
them in requests, against the API in-process with a real Redis: the service's secrets never come back, no file
outside the roots is opened or probed, a FIFO never blocks, a tiny pickle or zip never exhausts memory, a malformed
header is a 422 naming the field, and a registered name never silently changes what a directory means.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import threading
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from tests.service import api_client

SECRET = "s3cr3t-redis-password-0123456789"
ALICE = {"Authorization": "Bearer key-a"}
BOB = {"Authorization": "Bearer key-b"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("adversarial-home")
    data = home / "data"
    data.mkdir()
    secret = home / "redis-password"  # outside the data roots, as $EXPLAINQ_HOME/redis/password is
    secret.write_text(SECRET + "\n")
    with api_client(home, EXPLAINQ_API_KEYS="alice:key-a,bob:key-b") as client:
        yield {"client": client, "data": data, "secret": secret, "home": home, "settings": client.app.state.settings}


def _no_leak(env, response) -> None:
    body = response.text
    assert SECRET not in body
    assert str(env["home"]) not in body and str(env["data"]) not in body, body


def _triples_dir(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "train.txt").write_text("a\tr\tb\nb\tr\tc\n")
    return d


# ----------------------------------------------------------------------------------------------- containment
def test_a_symlink_inside_a_dataset_directory_cannot_read_the_servers_secrets(env) -> None:
    d = env["data"] / "linked-kg"
    d.mkdir()
    (d / "train.txt").symlink_to(env["secret"])
    r = env["client"].post("/datasets", json={"name": "linked-kg", "path": "linked-kg"}, headers=BOB)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "path"]
    assert "outside the data roots" in r.text
    _no_leak(env, r)


def test_a_symlink_two_levels_down_is_refused_too(env) -> None:
    d = env["data"] / "deep-mind"
    (d / "train").mkdir(parents=True)
    (d / "train" / "news.tsv").write_text("N1\tc\ts\ttitle\tabstract\n")
    (d / "train" / "behaviors.tsv").symlink_to(env["secret"])
    r = env["client"].post("/datasets", json={"name": "deep-mind", "path": "deep-mind"}, headers=BOB)
    assert r.status_code == 422, r.text
    _no_leak(env, r)


def _safetensors(path: Path, header: object) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def _lora_dir(root: Path, name: str, rows: list[tuple[str, str]]) -> Path:
    d = root / name
    d.mkdir()
    _safetensors(d / "a.safetensors", {"x.lora_A.weight": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 32]},
                                       "x.lora_B.weight": {"dtype": "F32", "shape": [4, 2], "data_offsets": [32, 64]}})
    (d / "labels.csv").write_text("file,label\n" + "".join(f"{f},{lab}\n" for f, lab in rows))
    return d


@pytest.mark.parametrize("listed", ["/etc/hostname", "../adversarial-outside.safetensors", "sub/../../x"])
def test_labels_csv_rows_cannot_name_files_outside_the_dataset(env, listed) -> None:
    """No byte of another file comes back (as a header length), and existing vs missing answer alike."""
    name = f"lora-escape-{abs(hash(listed)) % 10_000}"
    _lora_dir(env["data"], name, [(listed, "cat")])
    r = env["client"].post("/datasets", json={"name": name, "path": name}, headers=BOB)
    assert r.status_code == 422, r.text
    assert "relative paths inside the dataset directory" in r.text
    _no_leak(env, r)
    r2 = env["client"].post("/ablations", json={"dataset": name}, headers=BOB)
    assert r2.status_code == 422 and "relative paths inside the dataset directory" in r2.text, r2.text


def _read_test_triples(env, path: str):
    """The TracIn request's ``test_triples_path`` check, as the API runs it before queueing the job."""
    from core.contract.errors import FieldError
    from core.kinds.tracin import TracInRequest, _read_test_triples_path

    req = TracInRequest(model="conve-x", mode="test", test_triples_path=path)
    with pytest.raises(FieldError) as info:
        _read_test_triples_path(req, env["settings"])
    assert info.value.loc == ("body", "test_triples_path")
    return info.value.message


def test_a_fifo_is_refused_at_once_and_blocks_no_one(env) -> None:
    os.mkfifo(env["data"] / "tests.fifo")
    results: list = []
    t = threading.Thread(target=lambda: results.append(_read_test_triples(env, "tests.fifo")), daemon=True)
    started = time.monotonic()
    t.start()
    t.join(10)
    assert not t.is_alive(), "a FIFO named in a request blocked the API thread"
    assert time.monotonic() - started < 5
    assert results and "tests.fifo is not a regular file" in results[0]


def test_the_opener_refuses_a_fifo_and_a_link_out_directly(env) -> None:
    from core.userfiles import UserFileError, UserFiles

    files = UserFiles(env["settings"])
    fifo = env["data"] / "direct.fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserFileError, match="not a regular file"):
        files.open(fifo, "triples")
    link = env["data"] / "direct-link.txt"
    link.symlink_to(env["secret"])
    with pytest.raises(UserFileError, match="outside the data roots") as info:
        files.open(link, "triples")
    assert str(env["data"]) not in str(info.value) and str(env["secret"]) not in str(info.value)


def test_a_link_out_is_refused_where_proc_cannot_tell_what_was_opened(env, monkeypatch) -> None:
    """Without /proc (os.readlink failing), the path resolved before opening is still checked."""
    from core import userfiles

    link = env["data"] / "noproc-link.txt"
    link.symlink_to(env["secret"])

    real_readlink = os.readlink

    def no_proc(path, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(path).startswith("/proc/"):
            raise OSError("no /proc")
        return real_readlink(path, *a, **k)

    monkeypatch.setattr(userfiles.os, "readlink", no_proc)
    with pytest.raises(userfiles.UserFileError, match="outside the data roots"):
        userfiles.UserFiles(env["settings"]).open(link, "triples")


def test_a_directory_swapped_for_a_link_after_resolving_is_caught_by_what_was_opened(env, monkeypatch) -> None:
    """The path checked and the file opened can differ (a directory swapped for a symlink in between): the file
    actually opened, read back through /proc/self/fd, must lie inside the roots. Simulated by a resolver that
    returns the path unresolved, as a resolve done before the swap would."""
    from core import userfiles

    swapped = env["data"] / "swapped"
    swapped.symlink_to(env["secret"].parent)
    target = swapped / env["secret"].name
    monkeypatch.setattr(userfiles.os.path, "realpath", lambda p: str(p))
    with pytest.raises(userfiles.UserFileError, match="outside the data roots"):
        userfiles.UserFiles(env["settings"]).open(target, "triples")


def test_registering_a_directory_checks_every_entry_not_only_what_detection_reads(env) -> None:
    """A link out that dataset detection itself never opens (a file the worker's reader would) is refused too."""
    d = _triples_dir(env["data"], "extra-link-kg")
    (d / "entity_labels.tsv").symlink_to(env["secret"])
    r = env["client"].post("/datasets", json={"name": "extra-link-kg", "path": "extra-link-kg"}, headers=BOB)
    assert r.status_code == 422, r.text
    assert "entity_labels.tsv leads outside the data roots" in r.text
    _no_leak(env, r)


def test_reads_are_bounded_by_the_formats_cap(env, monkeypatch) -> None:
    from core import userfiles

    big = env["data"] / "big.txt"
    big.write_bytes(b"a\tr\tb\n" * 1000)
    monkeypatch.setitem(userfiles.SIZE_CAPS, "test_triples", 100)
    with pytest.raises(userfiles.UserFileError, match="at most 100"):
        userfiles.UserFiles(env["settings"]).open(big, "test_triples")


def test_test_triples_are_not_quoted_back_nor_named_by_server_path(env) -> None:
    """Bob names a file of Alice's: its malformed line is never echoed, and the file is named relative to the root."""
    private = env["data"] / "alice-private"
    private.mkdir()
    (private / "notes.txt").write_text("alice's private note: the launch is on friday\n")
    message = _read_test_triples(env, "alice-private/notes.txt")
    assert message == "alice-private/notes.txt:1: expected 3 tab-separated fields, got 1"
    message = _read_test_triples(env, str(private / "notes.txt"))  # an absolute path inside the roots
    assert message == "alice-private/notes.txt:1: expected 3 tab-separated fields, got 1"


# ----------------------------------------------------------------------------------------------- pickles, zips
def _bomb_pickle(repeats: int, size_len: int) -> bytes:
    """One memoised size list of ``size_len`` ints and ``repeats`` REDUCEs of _rebuild_tensor_v2 over it: a few
    bytes of input per tensor of ``size_len`` dimensions."""
    out = io.BytesIO()
    out.write(b"\x80\x02")
    out.write(b"ctorch._utils\n_rebuild_tensor_v2\n")
    out.write(b"q\x000")  # BINPUT 0: the callable, POP
    out.write(b"(" + b"K\x01" * size_len + b"tq\x02")  # a tuple of size_len ones, memo 2
    out.write(b"0")  # POP it (it stays in the memo)
    out.write(b"}q\x01(")  # an empty dict, memo 1, MARK
    for i in range(repeats):
        key = f"t{i}".encode()
        out.write(b"X" + struct.pack("<I", len(key)) + key)
        out.write(b"h\x00(NK\x00h\x02h\x02tR")  # callable (None, 0, size, size) REDUCE
    out.write(b"u.")  # SETITEMS, STOP
    return out.getvalue()


def _zip(path: Path, member: bytes, name: str = "archive/data.pkl", compress: bool = False) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as zf:
        zf.writestr(name, member)


def test_a_tiny_pickle_cannot_grow_the_api_by_its_size_lists(env) -> None:
    from models.weight_files import pickle_shapes

    path = env["data"] / "bomb.pt"
    _zip(path, _bomb_pickle(repeats=200, size_len=100_000))
    assert path.stat().st_size < 500_000
    tracemalloc.start()
    try:
        assert pickle_shapes(path) is None  # refused at the first 100,000-dimension tensor
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # the unbounded reader held every size tuple: 200 x 100k ints


def test_the_pickle_reader_stops_at_its_tensor_and_operation_limits(env, monkeypatch) -> None:
    from models import weight_files

    path = env["data"] / "many.pt"
    _zip(path, _bomb_pickle(repeats=50, size_len=2))
    assert weight_files.pickle_shapes(path) is not None  # a plain state dict of 50 tensors reads
    monkeypatch.setattr(weight_files, "MAX_TENSORS", 10)
    assert weight_files.pickle_shapes(path) is None
    monkeypatch.setattr(weight_files, "MAX_TENSORS", 100_000)
    monkeypatch.setattr(weight_files, "MAX_PICKLE_OPS", 100)
    assert weight_files.pickle_shapes(path) is None


def test_a_zip_bomb_is_not_inflated(env) -> None:
    from models.weight_files import MAX_PICKLE_BYTES, pickle_shapes

    path = env["data"] / "zipbomb.pt"
    _zip(path, b"\x00" * (MAX_PICKLE_BYTES * 4), compress=True)
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        assert pickle_shapes(path) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * MAX_PICKLE_BYTES


def test_a_pickle_bomb_through_models_import_keeps_the_api_small(env) -> None:
    d = env["data"] / "bomb-model"
    d.mkdir()
    _zip(d / "model.pt", _bomb_pickle(repeats=200, size_len=100_000))
    _zip(d / "checkpoint_1.pt", _bomb_pickle(repeats=200, size_len=100_000))
    (d / "train.txt").write_text("a\tr\tb\n")
    (d / "config.json").write_text(json.dumps({"embedding_dim": 20, "embedding_height": 4}))
    tracemalloc.start()
    try:
        r = env["client"].post("/models/import", json={
            "kind": "conve", "name": "bomb", "path": "bomb-model", "weights": "model.pt",
            "checkpoints": [{"file": "checkpoint_1.pt", "lr": 0.01}]}, headers=BOB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.status_code in (202, 422), r.text
    assert peak < 64 << 20, peak


# ----------------------------------------------------------------------------------------------- headers
BAD_HEADERS = {
    "a JSON list": [1, 2, 3],
    "no shape": {"x.lora_A.weight": {"dtype": "F32", "data_offsets": [0, 4]}},
    "a shape that is not a list": {"x.lora_A.weight": {"dtype": "F32", "shape": "big", "data_offsets": [0, 4]}},
    "nested 100k deep": "DEEP",
}


def _write_header(path: Path, header: object) -> None:
    if header == "DEEP":
        raw = b"[" * 100_000 + b"]" * 100_000
        path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    else:
        _safetensors(path, header)


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_malformed_safetensors_headers_are_422_on_datasets_and_ablations(env, case) -> None:
    name = "hdr-" + case.replace(" ", "-")
    d = env["data"] / name
    d.mkdir()
    _write_header(d / "a.safetensors", BAD_HEADERS[case])
    (d / "labels.csv").write_text("file,label\na.safetensors,cat\n")
    r = env["client"].post("/datasets", json={"name": name, "path": name}, headers=BOB)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "path"]
    if case == "nested 100k deep":  # refused by its nesting before the JSON parser recurses into it
        assert "nested too deep" in r.text
    r = env["client"].post("/ablations", json={"dataset": name}, headers=BOB)
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("case", [*sorted(BAD_HEADERS), "1-D tables"])
def test_malformed_safetensors_headers_are_422_on_models_import(env, case) -> None:
    name = "imp-" + case.replace(" ", "-")
    d = env["data"] / name
    d.mkdir()
    header = BAD_HEADERS.get(case) or {
        "ent.weight": {"dtype": "F32", "shape": [14], "data_offsets": [0, 56]},
        "rel.weight": {"dtype": "F32", "shape": [110], "data_offsets": [56, 496]}}
    _write_header(d / "model.safetensors", header)
    _write_header(d / "ck1.safetensors", header)
    (d / "train.txt").write_text("a\tr\tb\n")
    (d / "config.json").write_text(json.dumps({"embedding_dim": 20, "embedding_height": 4}))
    r = env["client"].post("/models/import", json={
        "kind": "conve", "name": name, "path": name, "weights": "model.safetensors",
        "checkpoints": [{"file": "ck1.safetensors", "lr": 0.01}]}, headers=BOB)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "weights"]


def test_a_news_config_cannot_point_its_encoder_at_a_server_path(env) -> None:
    d = env["data"] / "nrms-elsewhere"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"")
    for pretrained in (str(env["home"]), "../adversarial-home", "/"):
        (d / "config.json").write_text(json.dumps({"encoder": "bert", "pretrained": pretrained}))
        r = env["client"].post("/models/import", json={"kind": "nrms", "name": "nrms-x", "path": "nrms-elsewhere"},
                               headers=BOB)
        assert r.status_code == 422, r.text
        assert "config.pretrained" in r.text
        _no_leak(env, r)


# ----------------------------------------------------------------------------------------------- names
def test_registering_a_name_that_is_a_directory_is_refused(env) -> None:
    _triples_dir(env["data"], "alice-kg")
    _triples_dir(env["data"], "bob-two")
    r = env["client"].post("/datasets", json={"name": "alice-kg", "path": "bob-two"}, headers=BOB)
    assert r.status_code == 409, r.text
    assert r.json()["detail"]["loc"] == ["body", "name"]
    # registering one's own directory under its own name stays possible
    r = env["client"].post("/datasets", json={"name": "bob-two", "path": "bob-two"}, headers=BOB)
    assert r.status_code == 201, r.text


def test_a_name_registered_by_another_owner_never_silently_replaces_a_directory(env) -> None:
    """Bob registered ``carol-kg`` before Carol's directory of that name existed: Carol's request is refused as
    ambiguous (409, saying how to name each), never trained on Bob's triples; ``./carol-kg`` is her directory."""
    from core import registry

    bob_data = _triples_dir(env["data"], "bob-poison")
    registry.register_dataset(env["settings"], "carol-kg", kind="triples", path=bob_data, owner="bob")
    _triples_dir(env["data"], "carol-kg")
    from core.contract.errors import FieldConflict
    from core.kinds.train_conve import resolve_dataset

    with pytest.raises(FieldConflict, match="write './carol-kg' for the directory"):
        resolve_dataset(env["settings"], "carol-kg", "alice")
    assert resolve_dataset(env["settings"], "./carol-kg", "alice") == env["data"] / "carol-kg"
    assert resolve_dataset(env["settings"], "carol-kg", "bob") == bob_data  # the owner's own name is his
    r = env["client"].post("/train/conve", json={"dataset": "carol-kg", "name": "carol-model"}, headers=ALICE)
    assert r.status_code == 409, r.text
    assert r.json()["detail"]["loc"] == ["body", "dataset"]


# ----------------------------------------------------------------------------------------------- ownership
def test_the_files_of_a_job_whose_record_expired_stay_their_owners(env) -> None:
    """Once a job's record expired, its files' owner record decides: another key gets 404 as for a missing job."""
    from core.artifacts import record_owner
    from core.filestore import get_store

    job_id = "0123456789abcdef0123456789abcdef"
    record_owner(env["settings"], job_id, "alice", "train_bdh")
    get_store(env["settings"]).put_bytes(b"alice's result", f"artifacts/{job_id}/note.txt")
    client = env["client"]
    assert client.get(f"/jobs/{job_id}/artifacts", headers=ALICE).status_code == 200
    assert client.get(f"/jobs/{job_id}/artifacts/note.txt", headers=ALICE).content == b"alice's result"
    for path in (f"/jobs/{job_id}/artifacts", f"/jobs/{job_id}/artifacts/note.txt"):
        r = client.get(path, headers=BOB)
        assert r.status_code == 404, r.text
        assert "alice" not in r.text


def test_pickle_module_is_untouched_by_the_shape_reader() -> None:
    """The reader subclasses pickle's pure-Python unpickler; the module's own classes keep their dispatch."""
    from models.weight_files import _ShapeUnpickler

    assert _ShapeUnpickler.dispatch is not pickle._Unpickler.dispatch  # type: ignore[attr-defined]
