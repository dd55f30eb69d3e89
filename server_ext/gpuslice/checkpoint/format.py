"""The on-disk format of a checkpoint: named pickles with their large buffers out of band.

Pickle protocol 5 hands large contiguous buffers (NumPy arrays, bytes) to a callback
instead of copying them into the pickle stream, so a 1 GB array is written straight from
its memory and read back into one buffer: the cost is close to a raw sequential write.

Layout: ``MAGIC``, then records ``name, pickle, n_buffers, buffer…`` (each length-prefixed),
then an end marker; a file without the end marker is treated as corrupt.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

from ..errors import GPUSliceError

MAGIC = b"GPUSLICE-CKPT-1\n"
END = b"\xff" * 8
_LEN = struct.Struct("<Q")


class CorruptCheckpoint(GPUSliceError, ValueError):
    pass


def encode(value: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle ``value``; raises whatever pickle raises for unpicklable objects."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return data, [b.raw() for b in buffers]


def records(items: list[tuple[str, bytes, list[memoryview]]]) -> Iterator[bytes | memoryview]:
    yield MAGIC
    for name, data, buffers in items:
        raw_name = name.encode()
        yield _LEN.pack(len(raw_name)) + raw_name
        yield _LEN.pack(len(data))
        yield data
        yield _LEN.pack(len(buffers))
        for buf in buffers:
            yield _LEN.pack(buf.nbytes)
            yield buf
    yield END


def _read_exact(f: BinaryIO, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not k:
            raise CorruptCheckpoint("checkpoint file is truncated")
        got += k
    return buf


def _read_len(f: BinaryIO) -> int:
    raw = bytes(_read_exact(f, 8))
    if raw == END:
        return -1
    return int(_LEN.unpack(raw)[0])


def read_records(f: BinaryIO) -> Iterator[tuple[str, bytes, list[bytearray]]]:
    if f.read(len(MAGIC)) != MAGIC:
        raise CorruptCheckpoint("not a gpuslice checkpoint")
    while True:
        n = _read_len(f)
        if n < 0:
            return
        name = bytes(_read_exact(f, n)).decode()
        data = bytes(_read_exact(f, _read_len(f)))
        buffers = [_read_exact(f, _read_len(f)) for _ in range(_read_len(f))]
        yield name, data, buffers


def decode(data: bytes, buffers: list[bytearray]) -> Any:
    return pickle.loads(data, buffers=buffers)
