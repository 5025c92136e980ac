"""The files tenants bring, opened one way (no torch).

Tenants bring data by placing it under the data roots (``EXPLAINQ_DATA_ROOTS``, default ``EXPLAINQ_HOME/data``) and
naming it in requests. Everything the service opens on a tenant's behalf goes through here:

- :func:`resolve_data_path` turns a user-supplied path into a real path inside the roots (``..`` and symlinks
  resolved first, so neither can climb out); too long or malformed names are a :class:`PathError`.
- :meth:`UserFiles.open` opens one file for a reader: the path is resolved again at the moment of opening (every
  directory level and the file itself), and the file actually opened is checked to lie inside the roots; only a
  regular file is read (a FIFO, socket or device is refused without blocking), at most the format's size cap, and
  within a time budget. A file over its cap, or a read that runs past its budget, fails as :class:`UserFileError`.
- :func:`check_tree` walks a dataset directory before a reader that opens files by itself (torch, safetensors,
  numpy) gets it: every entry must be a regular file or directory inside the roots.
- Messages name files relative to their data root (``alice-kg/train.txt``), never by server path.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from core.limits import MAX_PATH_LENGTH
from models.files import LOCAL, LocalFiles

if TYPE_CHECKING:
    from core.settings import Settings

MiB = 1 << 20
GiB = 1 << 30
# The most a reader may read of one file, by format. A format not listed gets DEFAULT_CAP.
SIZE_CAPS: dict[str, int] = {
    "triples": 1 * GiB,          # head<TAB>relation<TAB>tail (FB15k-237's train.txt is 10 MB)
    "test_triples": 16 * MiB,    # a TracIn request's test triples (MAX_TEST_TRIPLES lines)
    "mind": 8 * GiB,             # news.tsv / behaviors.tsv (MIND-large's behaviors.tsv is about 2 GB)
    "csv": 4 * GiB,              # pairwise news CSV
    "labels_csv": 16 * MiB,      # a LoRA dataset's labels.csv
    "json": 16 * MiB,            # configs, dataset_info.json
    "safetensors": 64 * GiB,     # a weight file (its header is read with its own bound)
    "pickle": 16 * GiB,          # a torch.save zip archive
    "pickle_member": 256 * MiB,  # data.pkl inside it (the object graph, not the tensor bytes)
    "image_batch": 1 * GiB,      # a CIFAR python batch
    "program": 16 * GiB,         # a torch.export archive (.pt2: JSON and raw tensor bytes)
    "embeddings": 8 * GiB,       # GloVe text vectors (glove.840B.300d.txt is 5.6 GB)
}
DEFAULT_CAP = 1 * GiB
# The formats read line by line: a line longer than LINE_CAP bytes fails as UserFileError where a cap is set (the
# bounded parser of core.bounded sets EXPLAINQ_PARSER_LINE_BYTES; None: no cap, as on workers).
TEXT_FORMATS = frozenset({"triples", "test_triples", "mind", "csv", "labels_csv", "embeddings", "text"})
LINE_CAP: int | None = None
READ_BUDGET_S = 600.0            # one file, start to end of reading
MAX_PATH_CHARS = MAX_PATH_LENGTH  # a path a request names (core.limits)

# What Linux's file systems allow: bytes in one path component, and in a whole path (with its terminating NUL).
NAME_MAX = 255
PATH_MAX = 4096


class PathError(ValueError):
    """A user path that is empty, escapes the data roots, does not exist when it must, or that the file system
    cannot name (a component over NAME_MAX, a path over PATH_MAX)."""


def shown(raw: str, limit: int = 120) -> str:
    """``raw`` as a message quotes it: repr, cut to about ``limit`` characters."""
    return repr(raw) if len(raw) <= limit else f"{raw[:limit]!r}... ({len(raw)} characters)"


def check_path_lengths(raw: str, path: Path) -> None:
    """PathError when the file system cannot name ``path`` (every call on it would fail with ENAMETOOLONG)."""
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise PathError(f"{shown(raw)}: a path component is {len(os.fsencode(part))} bytes long; the file "
                            f"system allows {NAME_MAX}")
    if len(os.fsencode(str(path))) >= PATH_MAX:
        raise PathError(f"{shown(raw)}: the path is {len(os.fsencode(str(path)))} bytes long under the data root; "
                        f"the file system allows {PATH_MAX - 1}")


class UserFileError(ValueError):
    """A user file that may not be read (outside the roots, not a regular file, too large, too slow)."""


def _roots(settings: Settings) -> list[Path]:
    return [Path(os.path.realpath(r)) for r in settings.data_roots]


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def display(settings: Settings, path: Path | str) -> str:
    """``path`` relative to the data root that holds it (``alice-kg/train.txt``); only its name otherwise."""
    path = Path(path)
    for root in [*_roots(settings), *(Path(r) for r in settings.data_roots)]:
        if path.is_relative_to(root):
            return str(path.relative_to(root)) or "."
    return path.name


def _check_name(raw: str) -> None:
    if not isinstance(raw, str) or not raw.strip():
        raise PathError("path must be a non-empty string")
    if "\x00" in raw:
        raise PathError("path contains a NUL byte")
    if len(raw) > MAX_PATH_CHARS:
        raise PathError(f"{shown(raw)}: a path may have at most {MAX_PATH_CHARS} characters")


def resolve_data_path(settings: Settings, raw: str, must_exist: bool = True) -> Path:
    """Resolve ``raw`` to a real path inside one of ``settings.data_roots``.

    Relative paths are taken relative to each root in turn (first existing match wins, else the first root).
    Symlinks are resolved before the containment check, so a link pointing out of the roots is rejected, and so
    is any ``..`` that climbs out. Messages show the path as the caller gave it, never a root's server path.
    """
    _check_name(raw)
    roots = _roots(settings)
    given = Path(raw)
    candidates = [given] if given.is_absolute() else [root / given for root in roots]
    escaped = False
    for cand in candidates:
        try:
            check_path_lengths(raw, cand)
            resolved = Path(os.path.realpath(cand))
            check_path_lengths(raw, resolved)
            exists = resolved.exists()
        except UnicodeEncodeError:
            raise PathError(f"{shown(raw.encode('utf-8', 'backslashreplace').decode())}: not a path the file "
                            "system can encode") from None
        except OSError as exc:  # a loop of links, no permission...
            raise PathError(f"{shown(raw)} cannot be resolved ({os.strerror(exc.errno or errno.EINVAL)})") from None
        if not _inside(resolved, roots):
            escaped = True
            continue
        if must_exist and not exists:
            continue
        return resolved
    if escaped:
        raise PathError(f"{shown(raw)} is outside the data roots")
    raise PathError(f"{shown(raw)} does not exist under the data roots")


class _BoundedRaw(io.RawIOBase):
    """A file descriptor read at most ``cap`` bytes and until ``deadline``; past either, UserFileError."""

    def __init__(self, fd: int, cap: int, deadline: float, shown: str, line_cap: int | None = None):
        self._fd, self._cap, self._deadline, self._shown = fd, cap, deadline, shown
        self._read = 0
        self._line_cap, self._line = line_cap, 0  # bytes since the last newline

    def _check_lines(self, data: bytes) -> None:
        cap = self._line_cap
        if self._line + len(data) <= cap:  # no line in here can be over the cap
            last = data.rfind(b"\n")
            self._line = self._line + len(data) if last < 0 else len(data) - last - 1
            return
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if self._line + end - start > cap:
                break
            self._line, start = 0, end + 1
        else:
            self._line += len(data) - start
            if self._line <= cap:
                return
        raise UserFileError(f"{self._shown}: a line is longer than {cap} bytes (EXPLAINQ_PARSER_LINE_BYTES)")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - io protocol
        if time.monotonic() > self._deadline:
            raise UserFileError(f"{self._shown}: reading took longer than {READ_BUDGET_S:.0f} s")
        want = min(len(buffer), self._cap + 1 - self._read)
        if want <= 0:
            raise UserFileError(f"{self._shown}: more than {self._cap} bytes")
        data = os.read(self._fd, want)
        self._read += len(data)
        if self._read > self._cap:
            raise UserFileError(f"{self._shown}: more than {self._cap} bytes")
        if self._line_cap is not None:
            self._check_lines(data)
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return os.lseek(self._fd, offset, whence)

    def tell(self) -> int:
        return os.lseek(self._fd, 0, io.SEEK_CUR)

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


class UserFiles:
    """Opens user files for readers (the ``files`` argument of ``models`` readers; see :mod:`models.files`)."""

    def __init__(self, settings: Settings, budget_s: float = READ_BUDGET_S, line_cap: int | None = None):
        self.settings = settings
        self.roots = _roots(settings)
        self.budget_s = budget_s
        self.line_cap = line_cap if line_cap is not None else LINE_CAP

    def display(self, path: Path) -> str:
        return display(self.settings, path)

    def open(self, path: Path, fmt: str) -> BinaryIO:
        path = Path(path)
        shown = self.display(path)
        real = Path(os.path.realpath(path))
        if not _inside(real, self.roots):
            raise UserFileError(f"{shown} is outside the data roots")
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise UserFileError(f"{shown} does not exist") from None
        except OSError as exc:
            raise UserFileError(f"{shown} cannot be opened ({os.strerror(exc.errno or errno.EIO)})") from None
        try:
            self._check_opened(fd, shown, fmt)
        except BaseException:
            os.close(fd)
            raise
        cap = SIZE_CAPS.get(fmt, DEFAULT_CAP)
        line_cap = self.line_cap if fmt in TEXT_FORMATS else None
        return io.BufferedReader(_BoundedRaw(fd, cap, time.monotonic() + self.budget_s, shown, line_cap), 1 << 16)

    def _check_opened(self, fd: int, shown: str, fmt: str) -> None:
        """The descriptor is a regular file under its cap, and (where /proc tells) the file really opened lies inside
        the roots: a directory swapped for a symlink between resolving and opening is caught here."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserFileError(f"{shown} is not a regular file")
        cap = SIZE_CAPS.get(fmt, DEFAULT_CAP)
        if st.st_size > cap:
            raise UserFileError(f"{shown} is {st.st_size} bytes; a {fmt} file may have at most {cap}")
        try:
            opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            opened = None
        if opened is not None and not _inside(opened, self.roots):
            raise UserFileError(f"{shown} is outside the data roots")
        os.set_blocking(fd, True)


def files_for(settings: Settings, directory: Path) -> UserFiles | LocalFiles:
    """The file access for reading a dataset directory: :class:`UserFiles` for a directory under the data roots (a
    tenant's); plain access for the service's own copies in the store (a registered dataset uploaded there, which
    only the service writes)."""
    return UserFiles(settings) if _inside(Path(os.path.realpath(directory)), _roots(settings)) else LOCAL


def check_tree(settings: Settings, directory: Path, max_entries: int = 1_000_000) -> None:
    """Every entry under ``directory`` is a regular file or a directory inside the data roots (symlinks are followed
    only to check where they lead). For readers that open files by themselves (torch, safetensors, numpy)."""
    roots = _roots(settings)
    directory = Path(directory)
    real = Path(os.path.realpath(directory))
    if not _inside(real, roots):
        raise UserFileError(f"{display(settings, directory)} is outside the data roots")
    seen = 0
    for top, dirs, files in os.walk(real, followlinks=False):
        for name in [*dirs, *files]:
            seen += 1
            if seen > max_entries:
                raise UserFileError(f"{display(settings, directory)} holds more than {max_entries} entries")
            entry = Path(top) / name
            target = Path(os.path.realpath(entry))
            if not _inside(target, roots):
                raise UserFileError(f"{display(settings, entry)} leads outside the data roots")
            try:
                mode = os.stat(entry).st_mode
            except OSError:
                raise UserFileError(f"{display(settings, entry)} cannot be read") from None
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise UserFileError(f"{display(settings, entry)} is not a regular file")
