"""A worker unpickles no tenant's file in its own process (models/bounded_load.py): an imported model's pickled
weights are read in a child under an address-space limit, a CPU-time limit and a wall-clock timeout; past one the
job fails with a clear code naming the file relative to the data roots, and the worker's heartbeat thread keeps
running through the load.

Checked by removing each guard: with the child's RLIMIT_AS gone the crafted checkpoint is read to the end (about
1 GiB) and fails ``invalid_model``, not ``too_large``; with ``load_state_file`` loading in the worker's process
(``load_state_here``) the worker's peak memory grows by over 1 GiB and the heartbeat thread is starved for the
whole load (the C unpickler holds the GIL).
"""

from __future__ import annotations

import json
import threading
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.adversarial.test_bounded_parser import ordered_dict_bomb

torch = pytest.importorskip("torch")

MiB = 1 << 20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def _checkpoint_variant(path: Path, entries: int, copies: int, keep: bool = True) -> None:
    """The crafted pickle, opening with a global ``weights_only`` refuses (``numpy.dtype``, then popped) and in an
    archive with no ``version`` record: the weights-only load gives up and the checkpoint unpickler (the C one) runs
    every copy. ``keep=False`` pops each copy at once: slow, but small."""
    raw = ordered_dict_bomb(entries, copies)
    if not keep:
        raw = raw.replace(b"h\x00h\x01\x85R", b"h\x00h\x01\x85R0")
    raw = raw[:2] + b"cnumpy\ndtype\n0" + raw[2:]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", raw)


@pytest.fixture
def settings(tmp_path):
    from core.settings import Settings

    (tmp_path / "data").mkdir()
    return Settings(EXPLAINQ_HOME=str(tmp_path), EXPLAINQ_WORKER_LOAD_MEMORY_BYTES=str(256 * MiB),
                    EXPLAINQ_WORKER_LOAD_CPU_S="60", EXPLAINQ_WORKER_LOAD_TIMEOUT_S="120")


def _import(settings, request: dict):
    from core.kinds.import_model import ImportModelRequest
    from workers.jobs.import_model import run

    registered = []
    ctx = SimpleNamespace(settings=settings, job_id="j1", owner="alice", progress=lambda *a, **k: None,
                          register_model=lambda *a, **k: registered.append(a))
    return run(ImportModelRequest.model_validate(request), ctx), registered


def test_the_crafted_checkpoint_fails_too_large_and_the_worker_does_not_grow(settings) -> None:
    from workers.context import JobError

    d = settings.data_roots[0] / "od-bomb"
    d.mkdir()
    _checkpoint_variant(d / "model.pt", entries=100_000, copies=120)  # in one process: over 1 GiB
    assert (d / "model.pt").stat().st_size < 3 * MiB
    (d / "train.txt").write_text("a\tr\tb\n")
    (d / "entities.dict").write_text("0\ta\n1\tb\n")
    (d / "relations.dict").write_text("0\tr\n")
    (d / "config.json").write_text(json.dumps({"embedding_dim": 20, "embedding_height": 4}))
    import models.kg.importer  # noqa: F401 - torch and the importer mapped before the peak is reset

    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmHWM")
    with pytest.raises(JobError) as caught:
        _import(settings, {"kind": "conve", "name": "od-bomb", "path": "od-bomb", "weights": "model.pt",
                           "checkpoints": [{"file": "model.pt", "lr": 0.01}]})
    grown = (_status_kib("VmHWM") - before) * 1024
    assert caught.value.code == "too_large", caught.value.message
    assert caught.value.message == ("od-bomb/model.pt: loading it needed more than 256 MiB of memory beyond the "
                                    "file's own size (EXPLAINQ_WORKER_LOAD_MEMORY_BYTES)")
    assert str(settings.home) not in caught.value.message
    assert grown < 48 * MiB, grown


def test_a_legitimate_checkpoint_loads_identical_tensors(tmp_path) -> None:
    from models.bounded_load import LoadBounds
    from models.weight_files import load_state_file, load_state_here

    g = torch.Generator().manual_seed(0)
    state = {"ent.weight": torch.randn(300, 20, generator=g), "bn.num_batches_tracked": torch.tensor(7),
             "half": torch.randn(4, 5, generator=g).half(), "view": torch.arange(10.0)[2:8]}
    torch.save({"model_state_dict": state, "epoch": 3}, tmp_path / "model.pt")
    got = load_state_file(tmp_path / "model.pt", bounds=LoadBounds(256 * MiB, 60, 120))
    here = load_state_here(tmp_path / "model.pt")
    assert got.keys() == state.keys() == here.keys()
    for k, v in state.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v) and torch.equal(here[k], v), k


def test_a_file_that_is_not_a_state_dict_keeps_its_message(tmp_path) -> None:
    from models.bounded_load import LoadBounds, LoadRefused
    from models.weight_files import load_state_file

    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"^list\.pt does not hold a state dict") as caught:
        load_state_file(tmp_path / "list.pt", bounds=LoadBounds(256 * MiB, 60, 120))
    assert not isinstance(caught.value, LoadRefused)


def test_a_long_load_keeps_the_heartbeat_thread_running(tmp_path) -> None:
    """The worker's heartbeat is a thread (workers/worker.py, every TTL/4): it must run while a load runs."""
    from models.bounded_load import LoadBounds
    from models.weight_files import load_state_file

    _checkpoint_variant(tmp_path / "slow.pt", entries=100_000, copies=25, keep=False)
    beats: list[float] = []
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.05):
            beats.append(time.monotonic())

    thread = threading.Thread(target=beat, daemon=True)
    start = time.monotonic()
    thread.start()
    with pytest.raises(ValueError):
        load_state_file(tmp_path / "slow.pt", bounds=LoadBounds(512 * MiB, 60, 120))
    stop.set()
    thread.join()
    took = time.monotonic() - start
    gaps = [b - a for a, b in zip([start, *beats], [*beats, time.monotonic()], strict=True)]
    assert took > 2, took  # long enough that a starved thread would show
    assert max(gaps) < 0.5, (max(gaps), took)


def test_a_load_past_the_wall_timeout_is_killed_and_names_the_file(tmp_path) -> None:
    from models.bounded_load import LoadBounds, LoadRefused
    from models.weight_files import load_state_file

    _checkpoint_variant(tmp_path / "slow.pt", entries=100_000, copies=200, keep=False)
    start = time.monotonic()
    with pytest.raises(LoadRefused) as caught:
        load_state_file(tmp_path / "slow.pt", bounds=LoadBounds(512 * MiB, 60, 1.5), shown="kg/slow.pt")
    assert time.monotonic() - start < 10
    assert caught.value.code == "invalid_model"
    assert str(caught.value) == "kg/slow.pt: loading it took longer than 1.5 s (EXPLAINQ_WORKER_LOAD_TIMEOUT_S)"


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _pipes(pid: int) -> set[str]:
    links = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            links.add(str(fd.readlink()))
        except OSError:
            pass
    return {link for link in links if link.startswith("pipe:")}


def test_one_warm_child_serves_every_load_and_each_load_gets_a_fresh_child_without_its_pipes(tmp_path) -> None:
    """Torch is imported once per worker process (the warm child), each load runs in a child forked for it alone,
    which holds none of the pipes the warm child talks to the worker over (it can neither read the next request
    nor forge an answer), and a warm child that died is started again."""
    import models.bounded_load as bl
    from models.bounded_load import LoadBounds
    from models.weight_files import load_state_file

    bl.stop_warm_child()
    bounds = LoadBounds(256 * MiB, 60, 120)
    torch.save({"w": torch.arange(6.0)}, tmp_path / "small.pt")
    assert torch.equal(load_state_file(tmp_path / "small.pt", bounds=bounds)["w"], torch.arange(6.0))
    zygote = bl._SHARED[0].proc.pid
    zygote_pipes = _pipes(zygote)
    assert len(zygote_pipes) >= 2  # its stdin and its answers

    _checkpoint_variant(tmp_path / "slow.pt", entries=100_000, copies=25, keep=False)
    seen: dict[int, set[str]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for child in _children(zygote):
                try:
                    seen.setdefault(child, _pipes(child))
                except OSError:
                    pass
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with pytest.raises(ValueError):
        load_state_file(tmp_path / "slow.pt", bounds=bounds)
    done.set()
    watcher.join()
    assert seen, "no load child was seen"
    for child, pipes in seen.items():
        assert child != zygote
        assert not pipes & zygote_pipes, (pipes, zygote_pipes)
    assert bl._SHARED[0].proc.pid == zygote  # the same warm child served both loads

    bl._SHARED[0].proc.kill()
    bl._SHARED[0].proc.wait()
    assert torch.equal(load_state_file(tmp_path / "small.pt", bounds=bounds)["w"], torch.arange(6.0))
    assert bl._SHARED[0].proc.pid != zygote


def test_a_timed_out_load_leaves_the_warm_child_serving(tmp_path) -> None:
    import models.bounded_load as bl
    from models.bounded_load import LoadBounds, LoadRefused
    from models.weight_files import load_state_file

    _checkpoint_variant(tmp_path / "slow.pt", entries=100_000, copies=200, keep=False)
    torch.save({"w": torch.ones(3)}, tmp_path / "small.pt")
    load_state_file(tmp_path / "small.pt", bounds=LoadBounds(256 * MiB, 60, 120))
    zygote = bl._SHARED[0].proc.pid
    with pytest.raises(LoadRefused, match="took longer than 1 s"):
        load_state_file(tmp_path / "slow.pt", bounds=LoadBounds(512 * MiB, 60, 1.0))
    assert _children(zygote) == []  # the child was killed and reaped
    assert torch.equal(load_state_file(tmp_path / "small.pt", bounds=LoadBounds(256 * MiB, 60, 120))["w"],
                       torch.ones(3))
    assert bl._SHARED[0].proc.pid == zygote


def test_with_the_warm_child_off_each_load_starts_and_ends_its_own(tmp_path) -> None:
    import models.bounded_load as bl
    from models.bounded_load import LoadBounds
    from models.weight_files import load_state_file

    bl.stop_warm_child()
    torch.save({"w": torch.ones(2)}, tmp_path / "small.pt")
    got = load_state_file(tmp_path / "small.pt", bounds=LoadBounds(256 * MiB, 60, 120, warm=False))
    assert torch.equal(got["w"], torch.ones(2))
    assert bl._SHARED == []
