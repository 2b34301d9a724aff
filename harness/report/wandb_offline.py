"""Read a W&B offline run back from its `.wandb` file: history rows, final summary and config.

The file is wandb's transaction log: a 7-byte header (":W&B", magic 0xBEE1, version 0) and then the
LevelDB log format (32 KiB blocks of chunks, each chunk a 7-byte header: CRC-32 seeded with the chunk
type, little-endian length, type FULL/FIRST/MIDDLE/LAST), every record one `wandb.proto` `Record`
protobuf. wandb >= 0.20 writes it from its Go core and no longer ships the Python reader
(`wandb.sdk.internal.datastore`), so the framing is read here and the records with wandb's own protobufs.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

HEADER = struct.Struct("<4sHB")
IDENT, MAGIC, VERSION = b":W&B", 0xBEE1, 0
CHUNK = struct.Struct("<IHB")
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
# CRC-32 of the one-byte type, the seed of each chunk's checksum (as wandb's writer computes it).
_TYPE_CRC = {kind: zlib.crc32(bytes([kind])) for kind in (FULL, FIRST, MIDDLE, LAST)}


class WandbFileError(ValueError):
    """The file is not a W&B transaction log, or a chunk is corrupt."""


def offline_run_files(run_dir: Path) -> List[Path]:
    """The `.wandb` files below a harness run directory (its `wandb/` folder), oldest first."""
    return sorted(Path(run_dir).rglob("*.wandb"))


def record_payloads(path: Path) -> Iterator[bytes]:
    """Each record's bytes, chunks joined; stops quietly at a torn tail (a run still being written)."""
    data = Path(path).read_bytes()
    if len(data) < HEADER.size:
        raise WandbFileError(f"{path}: {len(data)} bytes is shorter than the W&B header")
    ident, magic, version = HEADER.unpack_from(data)
    if ident != IDENT or magic != MAGIC or version != VERSION:
        raise WandbFileError(f"{path}: header {ident!r} magic={magic:#x} version={version}, "
                             f"expected {IDENT!r} magic={MAGIC:#x} version={VERSION}")
    offset, pending = HEADER.size, b""
    while offset + CHUNK.size <= len(data):
        left = BLOCK - offset % BLOCK
        if left < CHUNK.size:  # the writer pads a block's tail that cannot hold a chunk header
            offset += left
            continue
        checksum, length, kind = CHUNK.unpack_from(data, offset)
        if kind == 0 and length == 0:  # preallocated, never written
            return
        body = data[offset + CHUNK.size: offset + CHUNK.size + length]
        if len(body) < length:
            return
        if kind not in _TYPE_CRC or zlib.crc32(body, _TYPE_CRC[kind]) != checksum:
            raise WandbFileError(f"{path}: corrupt chunk at byte {offset} (type {kind}, {length} bytes)")
        offset += CHUNK.size + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        else:
            yield pending + body
            pending = b""


def records(path: Path) -> Iterator[Any]:
    """The file's records as `wandb.proto.wandb_internal_pb2.Record` messages."""
    from wandb.proto import wandb_internal_pb2

    for payload in record_payloads(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def _key(item) -> List[str]:
    return list(item.nested_key) if item.nested_key else [item.key]


def _set(target: Dict[str, Any], keys: List[str], value: Any) -> None:
    for key in keys[:-1]:
        inner = target.get(key)
        if not isinstance(inner, dict):
            inner = target[key] = {}
        target = inner
    target[keys[-1]] = value


def _remove(target: Dict[str, Any], keys: List[str]) -> None:
    for key in keys[:-1]:
        target = target.get(key, {})
    if isinstance(target, dict):
        target.pop(keys[-1], None)


def read_offline_run(path: Path) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """(history rows in step order, final summary) of one `.wandb` file.

    The summary is every summary record applied in file order, as the server would end up with it.
    """
    history: List[Dict[str, Any]] = []
    summary: Dict[str, Any] = {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row: Dict[str, Any] = {}
            for item in record.history.item:
                _set(row, _key(item), json.loads(item.value_json))
            history.append(row)
        elif kind == "summary":
            for item in record.summary.update:
                _set(summary, _key(item), json.loads(item.value_json))
            for item in record.summary.remove:
                _remove(summary, _key(item))
    history.sort(key=lambda row: row.get("_step", 0))
    return history, summary


def read_offline_config(path: Path) -> Dict[str, Any]:
    """The run's config (as logged at init and updated later), values JSON-decoded, `_wandb` left out."""
    config: Dict[str, Any] = {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        updates = record.run.config if kind == "run" else record.config if kind == "config" else None
        if updates is None:
            continue
        for item in updates.update:
            _set(config, _key(item), json.loads(item.value_json))
        for item in updates.remove:
            _remove(config, _key(item))
    config.pop("_wandb", None)
    return config


def read_offline_run_info(path: Path) -> Dict[str, Any]:
    """Run id, project, entity, group, job type and display name from the run record."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            run = record.run
            return {"run_id": run.run_id, "project": run.project, "entity": run.entity, "group": run.run_group,
                    "job_type": run.job_type, "name": run.display_name}
    return {}


def run_finished(path: Path) -> bool:
    """Whether the file holds the run's exit record (written by `run.finish()`; a crashed run has none)."""
    return any(record.WhichOneof("record_type") == "exit" for record in records(path))


def wait_until_finished(path: Path, timeout_s: float = 30.0) -> bool:
    """Poll until the exit record is on disk: wandb's core process may still be writing the file for a
    moment after `run.finish()` has returned (seen on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while not run_finished(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True

