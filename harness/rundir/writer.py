"""The one way the harness writes a file: a unique temporary name beside the target, fsync, rename.

Readers never see half a file, two writers of one file never share a temporary name, and the file's
mode comes from the umask (as `open` would give it), so team-mates on a shared cluster can read it.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Union


def current_umask() -> int:
    """The process umask, read without changing it where Linux exposes it (/proc/self/status, 4.7+)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not thread-safe; the harness writes from one thread)
    os.umask(mask)
    return mask


def file_mode(executable: bool = False) -> int:
    """The mode `open` (0o666) or a script (0o777) would get under the current umask."""
    return (0o777 if executable else 0o666) & ~current_umask()


def _fsync_directory(folder: Path) -> None:
    """Make the rename itself durable (a crash after os.replace keeps the new name)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the data itself is already synced
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: Union[str, Path], executable: bool = False) -> Iterator[Path]:
    """Yield a unique temporary path beside `path`; once the body has written it, sync and rename it over
    `path`. If the body raises, the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:  # writers such as pandas close their own handle: sync it here
            os.fsync(handle.fileno())
        os.chmod(tmp, file_mode(executable))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def write_bytes(path: Union[str, Path], data: bytes, executable: bool = False) -> Path:
    with atomic_path(path, executable) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: Union[str, Path], text: str, executable: bool = False) -> Path:
    return write_bytes(path, text.encode("utf-8"), executable)


def write_json(path: Union[str, Path], payload: Any) -> Path:
    """JSON, indented and key-sorted (stable diffs), with a final newline."""
    return write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def write_with(path: Union[str, Path], writer: Callable[[Path], Any]) -> Path:
    """Let a library write the file (`frame.to_parquet`), still atomically."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)
