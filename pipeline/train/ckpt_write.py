"""Write a MindSpore ``.ckpt`` file while hashing its bytes, so a save never reads its own file back.

Why not ``ms.save_checkpoint``: it only writes to a path, so the sha256 that the sidecar and the commit marker
record had to come from reading the finished file again (a 70b rank file is many GB). The ``.ckpt`` format is a
sequence of serialized ``Checkpoint`` protobuf messages, one per tensor (per 512 MiB slice of a larger one), which
protobuf reads back as one message; this writes exactly the bytes ``ms.save_checkpoint`` writes for the same
entries (``tests/test_train_checkpoint_files.py`` compares them), through ``pipeline.io.HashingFile``, and
``ms.load_checkpoint`` reads the result unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable

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
