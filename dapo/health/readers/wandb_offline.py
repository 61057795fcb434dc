"""W&B run directories as ``wandb`` writes them offline (``wandb/offline-run-*/run-<id>.wandb``)
or while syncing (``wandb/run-*/``): the ``.wandb`` file is W&B's transaction log, LevelDB's
log format (32 KiB blocks of checksummed records; W&B's ``:W&B`` header) around protobuf
``Record`` messages. Each history record holds one ``run.log`` call: its items' keys and JSON
values, with ``_step``.

The framing is read here, as ``wandb.sdk.internal.datastore`` reads it (that module left the
package in 0.24, when the Go ``wandb-core`` took over); the records are decoded with the
package's own protobuf definitions (``wandb.proto.wandb_internal_pb2``, the ``health``
extra). A file still being written may end in a partial record: the rows before it are read,
and the reader says so."""

from __future__ import annotations

import importlib
import json
import struct
import zlib
from pathlib import Path
from typing import Any

from .base import CERTAIN, Reader, Rows, RunLogError, Text

HEADER = struct.Struct("<4sHB")  # ident ":W&B", magic 0xBEE1, version 0
RECORD = struct.Struct("<IHB")  # crc32 of type and data, length, type
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
TYPE_CRC = {t: zlib.crc32(bytes([t])) & 0xFFFFFFFF for t in (FULL, FIRST, MIDDLE, LAST)}


def run_files(path: Path) -> list[Path]:
    """The ``.wandb`` files of a run directory, or of every run under a ``wandb/`` directory or
    the directory it is in (``latest-run``, a link to one of them, is not read twice)."""
    if path.is_file():
        return [path]
    for pattern in ("*.wandb", "*/*.wandb", "wandb/*/*.wandb"):
        found = sorted(p for p in path.glob(pattern) if not p.parent.is_symlink())
        if found:
            # ``latest-run`` copied as a directory (a repository, an archive, a copy without
            # symlinks) holds the same run-<id>.wandb as the run's own directory: read it once
            names = {p.name for p in found if p.parent.name != "latest-run"}
            return [p for p in found if p.parent.name != "latest-run" or p.name not in names]
    return []


def records(path: Path) -> tuple[list[bytes], str | None]:
    """The payloads of a ``.wandb`` file, and a note when it ends in a partial record."""
    data = path.read_bytes()
    if len(data) < HEADER.size or HEADER.unpack_from(data)[0] != b":W&B":
        raise RunLogError(f"{path}: not a W&B transaction log (no ':W&B' header)")
    out: list[bytes] = []
    pos = HEADER.size
    pending: bytes | None = None  # a record split across blocks, FIRST seen, LAST not yet
    started = 0  # the byte its FIRST fragment is at
    partial = f"{path}: ends in a partial record (the run is still being written, or was cut off)"
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD.size:  # a block's tail too short for a header is zero padding
            pos += left
            continue
        if pos + RECORD.size > len(data):
            return out, f"{path}: ends in a partial record header (the run is still being written?)"
        crc, length, kind = RECORD.unpack_from(data, pos)
        body = data[pos + RECORD.size : pos + RECORD.size + length]
        if kind == 0 and length == 0 and crc == 0:  # preallocated, not yet written
            break
        if len(body) < length:
            return out, partial
        if kind not in TYPE_CRC or zlib.crc32(body, TYPE_CRC[kind]) & 0xFFFFFFFF != crc:
            raise RunLogError(f"{path}: byte {pos}: a record whose checksum does not match (corrupt file)")
        if (kind in (FULL, FIRST)) != (pending is None):  # as wandb's datastore asserted
            what = (
                f"the record begun at byte {started} is not finished"
                if pending is not None
                else "no record begun"
            )
            raise RunLogError(f"{path}: byte {pos}: a record fragment out of order: {what} (corrupt file)")
        if kind == FIRST:
            started = pos
        pos += RECORD.size + length
        if kind == FULL:
            out.append(body)
        elif kind == FIRST:
            pending = body  # may be empty: a FIRST where only its header fits in the block
        else:
            assert pending is not None
            pending += body
            if kind == LAST:
                out.append(pending)
                pending = None
    # a writer that is stopped between blocks leaves a FIRST fragment whose rest never came:
    # the file ends on a block boundary, every checksum right, and the last record missing
    return out, (partial if pending is not None else None)


def _record_type() -> Any:
    try:  # by name: the generated module has no type stubs, with or without wandb installed
        records_pb2 = importlib.import_module("wandb.proto.wandb_internal_pb2")
    except ImportError:
        raise RunLogError(
            "reading W&B run files (.wandb) needs the wandb package: pip install 'dapo-repro[health]'"
        ) from None
    return records_pb2.Record


def _read(path: Path) -> tuple[Rows, list[str]]:
    record_type = _record_type()
    files = run_files(path)
    rows: Rows = []
    notes: list[str] = []
    for file in files:
        payloads, note = records(file)
        if note:
            notes.append(note)
        label = file.stem.removeprefix("run-")
        found = 0
        for i, payload in enumerate(payloads):
            rec = record_type()
            try:
                rec.ParseFromString(payload)
            except Exception as err:  # protobuf's DecodeError
                raise RunLogError(f"{file}: record {i}: not a W&B record ({err})") from None
            if rec.WhichOneof("record_type") != "history":
                continue
            row: dict[str, Any] = {"_line": f"record {i}"}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                try:
                    row[key] = json.loads(item.value_json)
                except ValueError:
                    continue
            if "_step" not in row and rec.history.HasField("step"):
                row["_step"] = rec.history.step.num
            row["step"] = row.get("train/global_step", row.get("global_step", row.get("_step")))
            if len(files) > 1:
                row["_run"] = label
            rows.append(row)
            found += 1
        if not found:
            notes.append(
                f"{file}: no history records (nothing was logged with wandb.log before the file ends)"
            )
    return rows, notes


def _sniff(path: Path, text: Text) -> int:
    return CERTAIN if path.suffix == ".wandb" or (path.is_dir() and run_files(path)) else 0


READER = Reader("wandb-offline", "W&B run directories and their run-*.wandb files", _sniff, _read)
