"""Slot files (llama-server's --slot-save-path): a slot's prompt tokens and its KV cells (and a
recurrent or hybrid model's states after them), written by `POST /slots/{id}?action=save` and read
back by `action=restore`.

    magic b"TGGSLOT1", u32 header length, header (JSON), tokens (int32 x n),
    then per cache tensor (KVCache.tensors() order) its n rows of row bytes each,
    then (n > 0) per state tensor (RecurrentState.tensors() order) its one row

The header names the model the cells belong to: its architecture, vocabulary size, cache type,
row sizes and a fingerprint (SHA-256 of the GGUF file's header, which holds every metadata value
and tensor shape, and of the first and last MiB of its tensor data). A file from another model,
another cache type, or a truncated or altered file is refused with the reason.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import torch

from ..models.kv_cache import SeqCells

MAGIC = b"TGGSLOT1"
SAMPLE = 1 << 20  # bytes of tensor data hashed at each end


class SlotFileError(ValueError):
    """A slot file that cannot be restored here (another model, damaged): the reason."""


def model_identity(model) -> dict:
    """What a slot file records of the model whose cells it holds (computed once a model)."""
    cached = getattr(model, "_slot_identity", None)
    if cached is not None:
        return cached
    f = model.file
    data = f.data
    h = hashlib.sha256()
    h.update(data[:f.data_offset])
    h.update(data[f.data_offset: f.data_offset + SAMPLE])
    h.update(data[max(f.data_offset, len(data) - SAMPLE):])
    kv, rs = model.memory.attention, model.memory.recurrent
    identity = {"arch": f.arch, "n_vocab": int(model.n_vocab), "kv_type": kv.type.name.lower() if kv else None,
                "row_bytes": [int(t.nb[1]) for t in kv.tensors()] if kv else [],
                "state_bytes": [int(t.nb[1]) for t in rs.tensors()] if rs else [], "fingerprint": h.hexdigest()}
    model._slot_identity = identity
    return identity


def write(path: str, model, tokens: list[int], cells: SeqCells) -> int:
    """Write the slot file (through a temporary file, so a failed write leaves no half file);
    the bytes written."""
    if cells.n != len(tokens):
        raise ValueError(f"slot file: {len(tokens)} tokens but {cells.n} cells")
    header = json.dumps({"version": 1, "model": model_identity(model), "n_tokens": len(tokens)}).encode()
    tmp = path + ".tmp"
    with open(tmp, "wb") as out:
        out.write(MAGIC + struct.pack("<I", len(header)) + header)
        out.write(np.asarray(tokens, dtype="<i4").tobytes())
        for rows in cells.rows + cells.state:
            out.write(rows.numpy().tobytes())
    os.replace(tmp, path)
    return os.path.getsize(path)


def read(path: str, model) -> tuple[list[int], SeqCells, int]:
    """(tokens, cells, bytes read) of a slot file written for this model; SlotFileError otherwise."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise SlotFileError(f"slot file {name!r} does not exist") from None
    if raw[:len(MAGIC)] != MAGIC or len(raw) < len(MAGIC) + 4:
        raise SlotFileError(f"{name!r} is not a torchggml slot file")
    (size,) = struct.unpack_from("<I", raw, len(MAGIC))
    start = len(MAGIC) + 4
    try:
        header = json.loads(raw[start: start + size])
        saved, n = header["model"], int(header["n_tokens"])
    except (ValueError, KeyError, TypeError):
        raise SlotFileError(f"slot file {name!r}: its header is damaged") from None
    mine = model_identity(model)
    if saved != mine:
        keys = ", ".join(k for k in mine if saved.get(k) != mine[k])

        def brief(m):
            return f"{m.get('arch')} {m.get('kv_type')} cache, fingerprint {str(m.get('fingerprint'))[:12]}"
        raise SlotFileError(f"slot file {name!r} was saved from another model or cache type (differs in {keys}): "
                            f"{brief(saved)}; this server: {brief(mine)}")
    widths, state_widths = mine["row_bytes"], mine["state_bytes"] if n > 0 else []
    pos = start + size
    if n < 0 or len(raw) != pos + 4 * n + n * sum(widths) + sum(state_widths):
        raise SlotFileError(f"slot file {name!r} is truncated or damaged: {len(raw)} bytes for {n} tokens")
    tokens = np.frombuffer(raw, dtype="<i4", count=n, offset=pos).tolist()
    pos += 4 * n
    bad = [t for t in tokens if not 0 <= t < model.n_vocab]
    if bad:
        raise SlotFileError(f"slot file {name!r}: token id {bad[0]} is outside the vocabulary [0, {model.n_vocab})")
    rows = []
    for w in widths:
        part = bytearray(raw[pos: pos + n * w])  # (frombuffer refuses an empty buffer)
        rows.append(torch.frombuffer(part, dtype=torch.uint8).reshape(n, w) if part
                    else torch.empty((0, w), dtype=torch.uint8))
        pos += n * w
    state = []
    for w in state_widths:
        state.append(torch.frombuffer(bytearray(raw[pos: pos + w]), dtype=torch.uint8).reshape(1, w))
        pos += w
    return tokens, SeqCells(n, rows, state), len(raw)
