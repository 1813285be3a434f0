"""Files `pipewright.torch` writes, declared as the CLI declares its outputs
(cli/src/cli/outputs.rs): an output may not be a file the run reads (the same path, another
spelling of it, a symbolic or a hard link to it), and it is written whole or not at all.
Every refusal is a `RecordError` naming the path the user gave, never a temporary file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from ._errors import RecordError


def inputs_of(schedule: Any) -> list[tuple[str, str]]:
    """The files a schedule was built from, as (what, path): the timetable file that
    `pipewright.torch.schedule` loaded, when it was given as a path."""
    tt = getattr(schedule, "pipewright_timetable", None)
    source = getattr(tt, "source", None)
    if isinstance(source, str) and os.path.isfile(source):
        return [("the timetable", source)]
    return []


def output_path(path: Any, what: str) -> Path:
    """`path` as a path (str, bytes or os.PathLike), refused naming `what` otherwise."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        raise RecordError(f"{what}: give a path (str or os.PathLike), not {type(path).__name__}")
    path = Path(path)
    if not path.name:
        raise RecordError(f"{what} {str(path)!r}: give a file name, not a folder")
    return path


def _same_file(a: Path, b: str) -> bool:
    """One file under two names: the same inode (hard and symbolic links alike), or the
    same resolved path where the output does not exist yet."""
    try:
        if a.exists() and os.path.exists(b):
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)
    except OSError:
        return False


def write_output(path: Any, text: str, inputs: list[tuple[str, str]], what: str) -> None:
    """Write `text` to `path`, refusing a path that is one of `inputs`: into a temporary
    file beside it, then renamed over it, so a reader (and a failed write) never leaves
    half a file; the old file's permissions are kept."""
    path = output_path(path, what)
    for name, source in inputs:
        if _same_file(path, source):
            raise RecordError(
                f"{what} {path} is {name} {source} this run reads: writing it would destroy "
                "the input; give another file"
            )
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise RecordError(f"{what} {path}: folder {folder} does not exist; create it first")
    try:
        mode = path.stat().st_mode & 0o777 if path.is_file() else 0o644
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise RecordError(f"{what} {path}: cannot write in {folder}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        raise RecordError(f"{what} {path}: cannot write: {e.strerror} (the file is unchanged)") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
