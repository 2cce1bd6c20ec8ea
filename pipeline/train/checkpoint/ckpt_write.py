"""Write a MindSpore ``.ckpt`` file while hashing its bytes, so a save never reads its own file back; read one in a
single pass that both hashes and parses the same bytes, so a load never reads its file twice.

Why not ``ms.save_checkpoint``: it only writes to a path, so the sha256 that the sidecar and the commit marker
record had to come from reading the finished file again (a 70b rank file is many GB). The ``.ckpt`` format is a
sequence of serialized ``Checkpoint`` protobuf messages, one per tensor (per 512 MiB slice of a larger one), which
protobuf reads back as one message; this writes exactly the bytes ``ms.save_checkpoint`` writes for the same
entries (``tests/test_train_checkpoint_files.py`` compares them), through ``pipeline.io.HashingFile``, and
``ms.load_checkpoint`` reads the result unchanged.

Why not ``ms.load_checkpoint`` either: it only reads from a path, so checking a file against its digest meant
reading it once to hash it and once more to parse it. :func:`read` reads the file into memory once (as
``ms.load_checkpoint`` itself does), hashes those bytes, lets the caller refuse the digest, and only then parses
them into the same ``{name: Parameter}`` dict ``ms.load_checkpoint`` returns (the same conversion, slices of one
tensor joined; the test compares both on the dtypes the trainer writes)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from pipeline.io import HashingFile

SLICE_BYTES = 512 * 1024 * 1024  # MindSpore's slice of one tensor's bytes per protobuf message (SLICE_SIZE KiB)


def as_tensor(value):
    """What ``ms.save_checkpoint`` stores for an ``append_dict`` value: a Tensor (int -> Int64, float -> Float32)."""
    import mindspore as ms

    if isinstance(value, ms.Parameter):
        if getattr(value, "has_init", False):
            value.init_data()
        return value
    return value if isinstance(value, ms.Tensor) else ms.Tensor(value)


def write(path: str, entries: Iterable[tuple[str, object]]) -> tuple[str, int]:
    """Write ``entries`` (name, Tensor/Parameter/number) to ``path`` as a ``.ckpt``; ``(sha256 hex, bytes)`` of
    what was written, hashed on the way out."""
    from mindspore.train.checkpoint_pb2 import Checkpoint

    with open(path, "wb") as raw:
        f = HashingFile(raw)
        for name, value in entries:
            t = as_tensor(value)
            data = t.get_bytes()
            for i in range(0, len(data), SLICE_BYTES):  # as MindSpore: an empty tensor writes nothing
                msg = Checkpoint()
                v = msg.value.add()
                v.tag = name
                v.tensor.dims.extend(list(t.shape))
                v.tensor.tensor_type = str(t.dtype)
                v.tensor.tensor_content = data[i:i + SLICE_BYTES]
                f.write(msg.SerializeToString())
        raw.flush()
    return f.hash.hexdigest(), f.size


def cell_entries(cell, keep=None) -> list[tuple[str, object]]:
    """The parameters of ``cell`` by name, in ``ms.save_checkpoint(cell)``'s order, filtered by ``keep(name)``."""
    out, seen = [], set()
    for _, p in cell.parameters_and_names():
        if p.name in seen or (keep is not None and not keep(p.name)):
            continue
        seen.add(p.name)
        out.append((p.name, p))
    return out


def read(path: str, check: Callable[[str], None] | None = None) -> dict:
    """``ms.load_checkpoint(path)``'s ``{name: Parameter}`` from one read of ``path``. ``check(sha256 hex)`` gets the
    digest of exactly the bytes that are then parsed, before they are parsed: it raises to refuse the file (a torn or
    rotten file fails there, by its digest, not in the protobuf parser). A file that is no checkpoint at all (no
    digest to check it against) fails with a ``ValueError`` naming it."""
    with open(path, "rb") as f:
        data = f.read()
    if check is not None:
        check(hashlib.sha256(data).hexdigest())
    msg = _parse(data, path)
    del data  # as ms.load_checkpoint: the raw bytes are gone before the tensors are built
    return _params(msg, path)


def _parse(data: bytes, path: str):
    from google.protobuf.message import DecodeError
    from mindspore.train.checkpoint_pb2 import Checkpoint

    if data[-17:-10] == b"crc_num":  # ms.save_checkpoint(crc_check=True) appends "crc_num" + 10 bytes
        data = data[:-17]
    msg = Checkpoint()
    try:
        msg.ParseFromString(data)
    except DecodeError as e:
        raise ValueError(f"checkpoint {path}: not a readable .ckpt file ({e})") from None
    return msg


def _params(msg, path: str) -> dict:
    """MindSpore's own conversion (``serialization._load_ckpt_into_param_dict``): consecutive messages of one tag
    are the slices of one tensor, joined; dims ``[0]`` is a scalar; ``str`` entries are Python strings."""
    import numpy as np
    from mindspore import Parameter
    from mindspore._c_expression import TensorPy
    from mindspore.train.serialization import tensor_to_ms_type

    out, parts = {}, []
    values = msg.value
    for i, element in enumerate(values):
        if not element.HasField("tensor"):
            raise ValueError(f"checkpoint {path}: entry {element.tag!r} is a map parameter, which mindloom's "
                             f"checkpoints never hold")
        t = element.tensor
        parts.append(t.tensor_content)
        if i + 1 < len(values) and values[i + 1].tag == element.tag:
            continue
        data = b"".join(parts)
        parts.clear()
        if t.tensor_type == "str":
            out[element.tag] = str(np.frombuffer(data, "U" + str(len(t.tensor_content) // 4))[0])
            continue
        if t.tensor_type not in tensor_to_ms_type:
            raise ValueError(f"checkpoint {path}: entry {element.tag!r} has unknown type {t.tensor_type!r}")
        dims = list(t.dims)
        out[element.tag] = Parameter(TensorPy.convert_bytes_to_tensor(data, tuple([] if dims == [0] else dims),
                                                                      tensor_to_ms_type[t.tensor_type]),
                                     name=element.tag)
    if not out:
        raise ValueError(f"checkpoint {path}: holds no entries")
    return out
