"""Command-line arguments every command shares: a parser whose errors are one line, and the value rules of
options (seconds, names that become paths, folders the command will write into)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import List, NoReturn, Optional, Sequence

from harness.config.checks import SLUG, SLUG_RULE


class CommandLineError(ValueError):
    """A command line the command cannot run: its one line says which argument and why."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors raise CommandLineError (one line, the command's name first) instead of printing
    the usage block and exiting; `--help` still prints the help and exits 0."""

    def error(self, message: str) -> NoReturn:
        raise CommandLineError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def refuse_unknown(prog: str, extra: Sequence[str]) -> List[str]:
    """What parse_known_args left over, as Hydra overrides: anything that looks like an option is refused."""
    options = [arg for arg in extra if arg.startswith("-")]
    if options:
        raise CommandLineError(f"{prog}: unknown option {' '.join(options)} (see `{prog} --help`)")
    return list(extra)


def seconds(text: str) -> float:
    """A polling interval or timeout: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds > 0")
    return value


def poll_seconds(arg: str, prog: str) -> float:
    """`--poll=SECONDS` as `run` and `sweep` take it."""
    try:
        return seconds(arg.split("=", 1)[1])
    except argparse.ArgumentTypeError as error:
        raise CommandLineError(f"{prog}: --poll={error}") from None


def whole_number(text: str) -> int:
    """A count: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def slug(text: str) -> str:
    """A name that becomes a file or folder name: no separator, no leading dot, nothing a shell reads."""
    if not SLUG.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} {SLUG_RULE}")
    return text


def unwritable_folder(path: Path) -> Optional[str]:
    """Why files could not be written into `path` (made first where missing), as a rule after the value, or
    None. Nothing is created: the nearest existing folder above decides (a file there, or a folder this user
    may not write)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return "is a file, not a folder"
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"lies under {existing}, which is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return "is not writable" if existing == path else f"lies under {existing}, which is not writable"
    return None


def unwritable_file(path: Path) -> Optional[str]:
    """Why a file could not be written at `path` (its folders made first where missing), or None."""
    path = Path(path)
    if path.is_dir():
        return "is a folder, not a file"
    problem = unwritable_folder(path.parent)
    return f"cannot be written: its folder {path.parent} {problem}" if problem else None
