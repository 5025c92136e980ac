"""The API parses no user file in its own process (core/bounded.py): every read of a file's content runs in a child
under an address-space limit, a CPU-time limit, a wall-clock timeout and a line-length cap, and fails closed with a
413/422 naming the file relative to the data roots.

Each guard has a test that fails without it (checked by removing the guard: the RLIMIT_AS, RLIMIT_CPU, the
timeout, the line cap, and the child itself).
"""

from __future__ import annotations

import io
import json
import struct
import time
import zipfile
from pathlib import Path

import pytest

from tests.service import api_client

ALICE = {"Authorization": "Bearer key-a"}
MiB = 1 << 20


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("bounded-home")
    data = home / "data"
    data.mkdir()
    with api_client(home, EXPLAINQ_API_KEYS="alice:key-a", EXPLAINQ_PARSER_MEMORY_BYTES=str(384 * MiB),
                    EXPLAINQ_PARSER_CPU_S="20", EXPLAINQ_PARSER_TIMEOUT_S="60") as client:
        yield {"client": client, "data": data, "home": home, "settings": client.app.state.settings}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def _reset_peak() -> None:
    """Reset this process's VmHWM to its current RSS (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def _messages(response) -> str:
    detail = response.json()["detail"]
    return " | ".join(d["msg"] for d in detail) if isinstance(detail, list) else detail["message"]


def _no_server_path(env, response) -> None:
    assert str(env["home"]) not in response.text and str(env["data"]) not in response.text, response.text


# ------------------------------------------------------------------------------------------ the crafted .pt
def ordered_dict_bomb(entries: int, copies: int) -> bytes:
    """Issue 36, item 1: a dict of ``entries`` items built once (memo 1), then ``copies`` 4-op steps
    ``BINGET OrderedDict; BINGET bigdict; TUPLE1; REDUCE`` each of which copies it (a few bytes per copy)."""
    out = io.BytesIO()
    out.write(b"\x80\x02")
    out.write(b"ccollections\nOrderedDict\nq\x00")  # GLOBAL, BINPUT 0
    out.write(b"}q\x01(")  # EMPTY_DICT, BINPUT 1, MARK
    for i in range(entries):
        key = f"k{i}".encode()
        out.write(b"X" + struct.pack("<I", len(key)) + key + b"K\x01")
    out.write(b"u0")  # SETITEMS, POP (the dict stays in the memo)
    out.write(b"(")  # MARK
    out.write(b"h\x00h\x01\x85R" * copies)  # BINGET 0, BINGET 1, TUPLE1, REDUCE
    out.write(b"l.")  # LIST, STOP
    return out.getvalue()


def _zip(path: Path, member: bytes) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", member)


def test_the_ordered_dict_pickle_is_refused_and_the_api_does_not_grow(env) -> None:
    d = env["data"] / "od-bomb"
    d.mkdir()
    _zip(d / "model.pt", ordered_dict_bomb(entries=100_000, copies=120))
    assert (d / "model.pt").stat().st_size < 4 * MiB
    (d / "train.txt").write_text("a\tr\tb\n")
    (d / "config.json").write_text(json.dumps({"embedding_dim": 20, "embedding_height": 4}))
    _reset_peak()
    before = _status_kib("VmHWM")
    r = env["client"].post("/models/import", json={
        "kind": "conve", "name": "od-bomb", "path": "od-bomb", "weights": "model.pt",
        "checkpoints": [{"file": "model.pt", "lr": 0.01}]}, headers=ALICE)
    grown = (_status_kib("VmHWM") - before) * 1024
    assert r.status_code == 413, r.text
    assert r.json()["detail"]["code"] == "too_large"
    assert _messages(r) == "od-bomb: reading it needed more than 384 MiB of memory (EXPLAINQ_PARSER_MEMORY_BYTES)"
    _no_server_path(env, r)
    assert grown < 32 * MiB, grown  # in this process the 120 copies of a 100k-entry OrderedDict take over 1 GiB


# ------------------------------------------------------------------------------------------ CPU, wall clock
def _big_triples(root: Path, name: str, lines: int) -> Path:
    d = root / name
    d.mkdir()
    with open(d / "train.txt", "wb") as fh:
        for i in range(0, lines, 10_000):
            fh.write(b"".join(b"e%d\tr%d\te%d\n" % (j, j % 7, j + 1) for j in range(i, i + 10_000)))
    return d


def test_a_parse_past_the_cpu_limit_is_refused_within_the_wall_timeout(env, monkeypatch) -> None:
    _big_triples(env["data"], "cpu-kg", 2_000_000)  # 2M triples: several CPU-seconds to count
    monkeypatch.setattr(env["settings"], "parser_cpu_s", 1)
    start = time.monotonic()
    r = env["client"].post("/datasets", json={"name": "cpu-kg", "path": "cpu-kg"}, headers=ALICE)
    took = time.monotonic() - start
    assert r.status_code == 422, r.text
    assert _messages(r) == "cpu-kg: reading it needed more than 1 s of CPU time (EXPLAINQ_PARSER_CPU_S)"
    assert took < env["settings"].parser_timeout_s
    _no_server_path(env, r)


def test_a_parse_past_the_wall_timeout_is_killed_and_refused(env, monkeypatch) -> None:
    _big_triples(env["data"], "slow-kg", 2_000_000)  # several CPU-seconds to count, within the 20 s CPU limit
    monkeypatch.setattr(env["settings"], "parser_timeout_s", 0.5)
    start = time.monotonic()
    r = env["client"].post("/datasets", json={"name": "slow-kg", "path": "slow-kg"}, headers=ALICE)
    took = time.monotonic() - start
    assert r.status_code == 422, r.text
    assert _messages(r) == "slow-kg: reading it took longer than 0.5 s (EXPLAINQ_PARSER_TIMEOUT_S)"
    assert took < 5


# ------------------------------------------------------------------------------------------ line length
def test_a_line_past_the_line_cap_is_refused_naming_the_file(env, monkeypatch) -> None:
    d = env["data"] / "long-line"
    d.mkdir()
    with open(d / "train.txt", "wb") as fh:
        fh.write(b"a\tr\tb\n")
        fh.write(b"x" * (3 * MiB) + b"\tr\tb\n")  # one 3 MiB entity name
    monkeypatch.setattr(env["settings"], "parser_line_bytes", 1 * MiB)
    r = env["client"].post("/datasets", json={"name": "long-line", "path": "long-line"}, headers=ALICE)
    assert r.status_code == 422, r.text
    assert _messages(r) == (f"long-line/train.txt: a line is longer than {MiB} bytes (EXPLAINQ_PARSER_LINE_BYTES)")
    monkeypatch.setattr(env["settings"], "parser_line_bytes", 4 * MiB)
    r = env["client"].post("/datasets", json={"name": "long-line", "path": "long-line"}, headers=ALICE)
    assert r.status_code == 201, r.text  # an ordinary file under the cap registers as before


def test_the_line_cap_sees_a_long_line_inside_one_read() -> None:
    from core.userfiles import UserFileError, _BoundedRaw

    class Raw(_BoundedRaw):
        def __init__(self, line_cap: int):
            super().__init__(-1, 1 << 30, float("inf"), "f.txt", line_cap)

    Raw(10)._check_lines(b"0123456789\n0123456789\n01234")  # every line at the cap
    with pytest.raises(UserFileError, match="longer than 10 bytes"):
        Raw(10)._check_lines(b"short\n" + b"y" * 11 + b"\nshort\n")  # inside one chunk
    raw = Raw(10)
    raw._check_lines(b"\n012345")
    with pytest.raises(UserFileError):
        raw._check_lines(b"67890\n")  # across two chunks


# ------------------------------------------------------------------------------------------ the API parses nothing
def test_the_api_process_never_runs_the_readers(env, monkeypatch) -> None:
    """Every reader the API used to run in its own process raises here; registration, counting and import checks
    still answer as before, computed in the child."""
    import core.dataset_formats as formats
    import core.kinds.import_model as import_model
    import models.kg.tsv as tsv
    import models.weight_files as weight_files

    def boom(*_a, **_k):
        raise AssertionError("a user file's content was read in the API process")

    for module, name in ((formats, "detect"), (formats, "tensor_splits"), (tsv, "read_triples"),
                         (weight_files, "pickle_shapes"), (import_model, "_conve_header_check"),
                         (import_model, "inspect_hf"), (import_model, "inspect_export")):
        monkeypatch.setattr(getattr(module, name), "__code__", boom.__code__)  # every reference to it
    d = env["data"] / "plain-kg"
    d.mkdir()
    (d / "train.txt").write_text("a\tr\tb\nb\tr\tc\n")
    r = env["client"].post("/datasets", json={"name": "plain-kg", "path": "plain-kg"}, headers=ALICE)
    assert r.status_code == 201, r.text
    assert r.json()["counts"] == {"train_triples": 2, "entities": 3, "relations": 1}


def test_only_allow_listed_parsers_run(env) -> None:
    from core.bounded import run_bounded

    with pytest.raises(KeyError, match="not a bounded parser"):
        run_bounded(env["settings"], "os:system", {}, loc=("body",))


def test_children_at_once_are_bounded_and_a_full_house_is_503(env, monkeypatch) -> None:
    """EXPLAINQ_PARSER_CONCURRENCY children at most (their memory limits add up); none free in time: 503 busy."""
    import subprocess
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from core import bounded
    from core.contract.errors import FieldBusy

    d = env["data"] / "small-kg"
    d.mkdir()
    (d / "train.txt").write_text("a\tr\tb\n")
    alive, peak, lock = [0], [0], threading.Lock()
    real = subprocess.Popen

    class Counted(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            with lock:
                alive[0] += 1
                peak[0] = max(peak[0], alive[0])

        def wait(self, *a, **k):
            code = super().wait(*a, **k)
            with lock:
                if not getattr(self, "_counted_out", False):
                    self._counted_out = True
                    alive[0] -= 1
            return code

    monkeypatch.setattr(bounded.subprocess, "Popen", Counted)
    monkeypatch.setattr(env["settings"], "parser_concurrency", 2)

    def one(_: int) -> int:
        found = bounded.run_bounded(env["settings"], "dataset.detect", {"path": str(d)}, loc=("body", "path"))
        return found["found"]["counts"]["train_triples"]

    with ThreadPoolExecutor(6) as ex:
        assert list(ex.map(one, range(12))) == [1] * 12
    assert peak[0] == 2

    slots = bounded._slots(2)
    assert slots.acquire() and slots.acquire()  # every slot taken
    try:
        monkeypatch.setattr(env["settings"], "parser_timeout_s", 0.2)
        r = env["client"].post("/datasets", json={"name": "small-kg", "path": "small-kg"}, headers=ALICE)
        assert r.status_code == 503 and r.headers["Retry-After"] == "5", r.text
        assert r.json()["detail"]["code"] == FieldBusy.code
    finally:
        slots.release()
        slots.release()


def test_the_parsers_children_run_below_the_api(env, monkeypatch) -> None:
    """EXPLAINQ_PARSER_NICE (10): a long read in a child yields the CPUs to the API's own requests."""
    import os
    import subprocess
    import threading

    from core import bounded

    _big_triples(env["data"], "nice-kg", 1_000_000)
    seen: list[int] = []
    real = subprocess.Popen

    class Watched(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            threading.Thread(target=self._watch, daemon=True).start()

        def _watch(self) -> None:
            while self.poll() is None:
                try:
                    seen.append(int(Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[16]))
                except (OSError, IndexError, ValueError):
                    pass
                time.sleep(0.01)

    monkeypatch.setattr(bounded.subprocess, "Popen", Watched)
    r = env["client"].post("/datasets", json={"name": "nice-kg", "path": "nice-kg"}, headers=ALICE)
    assert r.status_code == 201, r.text
    assert seen and max(seen) == min(os.nice(0) + 10, 19), seen
