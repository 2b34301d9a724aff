"""Check a `data=text` file before launch: it exists, is readable, decodes, and holds a micro-batch of tokens."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Iterable, Optional, Tuple

# harness.runtime.data tokenises bytes (one token per UTF-8 byte, one more per record), so a byte token
# needs a vocabulary of 256.
BYTE_VOCAB = 256
# Files above this are checked on their first bytes only: they cannot lack tokens, and reading them
# whole would slow every composition.
READ_LIMIT = 64 * 2**20
# The `datasets` builder harness.runtime.data picks by extension (anything else is read as lines of text).
BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}

Problem = Tuple[str, object, str]


def data_file_problem(data: Any, layout: Any, vocab_size: Optional[int]) -> Optional[Problem]:
    """The first thing wrong with the text data of a run, or None (synthetic data needs nothing)."""
    if data.kind != "text":
        return None
    if not data.path:
        return "data.path", data.path, "is not set: data=text reads a local file (data.path=/path/to/file.txt)"
    if vocab_size is not None and vocab_size < BYTE_VOCAB:
        return ("model.hf_config.vocab_size", vocab_size,
                f"must be >= {BYTE_VOCAB} for data=text (one token per byte)")
    path = Path(data.path)
    problem = _access_problem(path)
    if problem:
        return "data.path", data.path, problem
    try:
        tokens = count_tokens(path, data.text_column)
    except (UnicodeDecodeError, ValueError, KeyError, csv.Error) as error:
        return "data.path", data.path, f"does not decode as {builder_for(path)} data: {_short(error)}"
    need = layout.micro_batch * layout.seq_len
    if tokens < need:
        return ("data.path", data.path, f"holds {tokens} byte tokens, fewer than one micro-batch "
                f"(layout.micro_batch={layout.micro_batch} x layout.seq_len={layout.seq_len} = {need})")
    return None


def _access_problem(path: Path) -> Optional[str]:
    if not path.exists():
        return "does not exist"
    if not path.is_file():
        return "is not a regular file"
    if not os.access(path, os.R_OK):
        return "is not readable by this user"
    if path.stat().st_size == 0:
        return "is empty"
    return None


def builder_for(path: str) -> str:
    """The `datasets` builder that reads `path`, by its extension (anything else is lines of text)."""
    return BUILDERS.get(Path(path).suffix.lower(), "text")


def count_tokens(path: Path, text_column: str) -> int:
    """Byte tokens the runtime would pack from this file (from its first READ_LIMIT bytes)."""
    builder = builder_for(path)
    if builder == "parquet":
        return _parquet_tokens(path, text_column)
    with open(path, "rb") as handle:
        raw = handle.read(READ_LIMIT)
    truncated = path.stat().st_size > READ_LIMIT
    if b"\x00" in raw:
        raise ValueError("it holds NUL bytes (a binary file?)")
    text = raw.decode("utf-8", errors="strict") if not truncated else _decode_prefix(raw)
    if builder == "text":
        return sum(len(line.encode()) + 1 for line in text.splitlines())
    records = _json_records(text, truncated) if builder == "json" else csv.DictReader(io.StringIO(text))
    return _column_tokens(records, text_column)


def _decode_prefix(raw: bytes) -> str:
    """Decode the first bytes of a long file; a character cut at the end is not an error."""
    import codecs

    return codecs.getincrementaldecoder("utf-8")("strict").decode(raw, final=False)


def _json_records(text: str, truncated: bool) -> Iterable[dict]:
    stripped = text.lstrip()
    if stripped.startswith("[") and not truncated:
        return json.loads(stripped)
    lines = [line for line in text.splitlines() if line.strip()]
    if truncated:
        lines = lines[:-1]
    return [json.loads(line) for line in lines]


def _column_tokens(records: Iterable[Any], text_column: str) -> int:
    total = 0
    for record in records:
        if not isinstance(record, dict) or text_column not in record:
            raise KeyError(f"a record has no data.text_column={text_column!r}")
        total += len(str(record[text_column]).encode()) + 1
    return total


def _parquet_tokens(path: Path, text_column: str) -> int:
    import pyarrow.lib
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=[text_column])
    except (pyarrow.lib.ArrowInvalid, KeyError) as error:
        raise ValueError(_short(error)) from error
    return sum(len(str(text).encode()) + 1 for text in table.column(text_column).to_pylist())


def _short(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
