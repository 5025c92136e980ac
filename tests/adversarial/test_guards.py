"""One test per guard that nothing else would miss: each fails with its guard removed.

The artifact key's containment against a percent-encoded ``..`` the HTTP client sends as is, the parent listing of
another owner's job, path containment by path components (not string prefixes), the NUL byte in a path, the
bounded reader's byte cap and time budget, mode 'single''s pair count, and ``augment`` among the settings a resumed
Vision-BDH run may not change."""

from __future__ import annotations

import os
import time

import pytest

from tests.service import api_client

ALICE = {"Authorization": "Bearer key-a"}
BOB = {"Authorization": "Bearer key-b"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from core.settings import Settings

    home = tmp_path_factory.mktemp("guards")
    (home / "data").mkdir()
    with api_client(home, EXPLAINQ_API_KEYS="alice:key-a,bob:key-b") as client:
        yield {"client": client, "home": home, "data": home / "data",
               "settings": Settings(EXPLAINQ_HOME=str(home), REDIS_URL=client.app.state.settings.redis_url)}


# ------------------------------------------------------------------------------------------------ artifacts
def test_a_percent_encoded_dot_dot_cannot_reach_another_jobs_artifact(env) -> None:
    """``%2e%2e`` travels as is (the client collapses only literal dots) and the server decodes it: the key it
    builds must still lie under the caller's job."""
    import httpx

    from core.artifacts import record_owner
    from core.filestore import get_store

    alice_job, bob_job = "a" * 32, "b" * 32
    record_owner(env["settings"], alice_job, "alice", "train_bdh")
    record_owner(env["settings"], bob_job, "bob", "train_bdh")
    store = get_store(env["settings"])
    store.put_bytes(b"alice's own", f"artifacts/{alice_job}/mine.txt")
    store.put_bytes(b"bob's secret", f"artifacts/{bob_job}/secret.txt")
    client = env["client"]
    assert client.get(f"/jobs/{alice_job}/artifacts/mine.txt", headers=ALICE).content == b"alice's own"
    for hop in ("%2e%2e", "%2E%2E", ".%2e", "%2e%2e%2f%2e%2e%2fartifacts"):
        url = f"/jobs/{alice_job}/artifacts/{hop}/{bob_job}/secret.txt"
        assert b"%2" in httpx.URL("http://t" + url).raw_path  # sent encoded, not collapsed by the client
        r = client.get(url, headers=ALICE)
        assert r.status_code == 404, (hop, r.status_code, r.content)
        assert b"bob's secret" not in r.content


# ------------------------------------------------------------------------------------------------ jobs
def test_the_shards_of_another_owners_job_are_not_found(env) -> None:
    client = env["client"]
    r = client.post("/test/sleep", json={"steps": 1}, headers=ALICE)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    assert client.get("/jobs", params={"parent": job}, headers=ALICE).json() == {"items": [], "next_cursor": None}
    r = client.get("/jobs", params={"parent": job}, headers=BOB)
    assert r.status_code == 404, r.text
    assert r.json()["detail"]["loc"] == ["query", "parent"]


def test_cancelling_another_owners_job_is_not_found_and_leaves_it(env) -> None:
    client = env["client"]
    job = client.post("/test/sleep", json={"steps": 1}, headers=ALICE).json()["id"]
    assert client.delete(f"/jobs/{job}", headers=BOB).status_code == 404
    assert client.get(f"/jobs/{job}", headers=ALICE).json()["status"] == "queued"


# ------------------------------------------------------------------------------------------------ paths
def test_a_sibling_directory_sharing_the_roots_prefix_is_outside(env) -> None:
    """``<root>-backup`` starts with the root's name but is not inside it (a string-prefix test would say so)."""
    from core.userfiles import PathError, UserFileError, UserFiles, _inside, resolve_data_path

    root = env["data"]
    backup = root.parent / (root.name + "-backup")
    backup.mkdir(exist_ok=True)
    (backup / "secret.txt").write_text("not a tenant's")
    assert _inside(root / "x", [root]) and _inside(root, [root])
    assert not _inside(backup / "secret.txt", [root]) and not _inside(backup, [root])
    with pytest.raises(PathError, match="outside the data roots"):
        resolve_data_path(env["settings"], str(backup / "secret.txt"))
    (root / "to-backup").symlink_to(backup)
    with pytest.raises(UserFileError, match="outside the data roots"):
        UserFiles(env["settings"]).open(root / "to-backup" / "secret.txt", "triples")
    r = env["client"].post("/datasets", json={"name": "backup", "path": str(backup)}, headers=ALICE)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "path"], r.text


@pytest.mark.parametrize("path", ["kg\x00/train.txt", "\x00", "/etc/passwd\x00"])
def test_a_nul_byte_in_a_path_is_a_422_naming_the_field(env, path: str) -> None:
    client = env["client"]
    r = client.post("/datasets", json={"name": "nul-kg", "path": path}, headers=ALICE)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "path"]
    r = client.post("/models/import", json={"kind": "conve", "name": "nul-model", "path": path}, headers=ALICE)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "path"]


# ------------------------------------------------------------------------------------------------ the reader
def test_the_bounded_reader_stops_at_its_byte_cap_when_the_file_grows_after_opening(env, monkeypatch) -> None:
    """The size is checked at opening; a file that grows afterwards is still read only up to the cap."""
    from core import userfiles

    monkeypatch.setitem(userfiles.SIZE_CAPS, "triples", 100_000)
    path = env["data"] / "growing.txt"
    path.write_bytes(b"a\tr\tb\n" * 10_000)  # 60,000 bytes: under the cap at opening
    with userfiles.UserFiles(env["settings"]).open(path, "triples") as fh:
        with open(path, "ab") as grow:
            grow.write(b"a\tr\tb\n" * 100_000)
        with pytest.raises(userfiles.UserFileError, match="more than 100000 bytes"):
            while fh.read(1 << 16):
                pass


def test_the_bounded_reader_stops_at_its_time_budget(env) -> None:
    from core import userfiles

    path = env["data"] / "slow.txt"
    path.write_bytes(b"x" * 300_000)
    with userfiles.UserFiles(env["settings"], budget_s=0.2).open(path, "triples") as fh:
        assert fh.read(10) == b"x" * 10  # the first buffer comes at once
        time.sleep(0.3)  # a reader that is slower than its budget (a blocked device, a huge parse)
        with pytest.raises(userfiles.UserFileError, match="reading took longer than"):
            fh.read()
    assert os.path.getsize(path) == 300_000


# ------------------------------------------------------------------------------------------------ limits
def test_mode_single_refuses_more_pairs_than_one_job_returns() -> None:
    from core import limits
    from core.contract.errors import FieldError
    from core.kinds.tracin import TracInRequest, _check_sizes

    def request(n_test: int, n_train: int) -> TracInRequest:
        return TracInRequest.model_validate({
            "model": "m", "mode": "single",
            "test_triples": [[f"h{i}", "r", "t"] for i in range(n_test)],
            "train_triples": [[f"x{i}", "r", "y"] for i in range(n_train)]})

    assert limits.MAX_SINGLE_PAIRS == 1_000_000
    _check_sizes(request(1_000, 1_000))  # exactly the limit
    with pytest.raises(FieldError, match="1000 x 1001 pairs is more than 1000000") as exc:
        _check_sizes(request(1_000, 1_001))
    assert exc.value.loc == ("body", "train_triples")


def test_resuming_with_augment_changed_is_refused() -> None:
    from models.vision.train import ResumeMismatch, TrainConfig, compare_resume_config

    saved = TrainConfig(augment=True).to_dict()
    with pytest.raises(ResumeMismatch, match="augment"):
        compare_resume_config(saved, TrainConfig(augment=False), epochs_done=1)
    assert compare_resume_config(saved, TrainConfig(augment=True), epochs_done=1) == {}
