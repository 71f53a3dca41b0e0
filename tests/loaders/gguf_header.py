"""A fast, read-only GGUF header parser for the real-checkpoint tests.

`gguf.GGUFReader` builds numpy views for every element of every metadata
array: 10-13 s on a 150k-260k token vocab (Qwen2.5, Gemma 3) on a CI core,
for tests that need the tensor shapes or a few metadata keys. This reads
the same header (GGUF v2/v3, little-endian) with `struct` in well under a
second. `read_header(path).fields[key]` has GGUFReader's `types` and
`contents()` (the part `kvq_jax.loaders.gguf.metadata_value` reads), and
`.tensors` lists (name, shape) in file order.

kvq_jax's own reader (`kvq_jax.loaders.gguf.open_gguf`) stays covered on
real files by test_real_smollm2.py and on synthetic ones by test_gguf.py.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any

import numpy as np
from gguf import GGUFValueType

_SCALARS = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2", GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "<u8", GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}


@dataclasses.dataclass(frozen=True)
class Field:
  """One metadata key: GGUFReader's `types` and `contents()`."""

  types: list[GGUFValueType]
  value: Any  # str, a Python scalar, or a list of either.

  def contents(self) -> Any:
    return self.value


@dataclasses.dataclass(frozen=True)
class Header:
  fields: dict[str, Field]
  tensors: list[tuple[str, tuple[int, ...]]]

  def num_elements(self) -> int:
    """Elements of every tensor in the file (the model's parameters)."""
    return sum(int(np.prod(shape)) for _, shape in self.tensors)


class _Cursor:

  def __init__(self, data: bytes | mmap.mmap):
    self.data, self.pos = data, 0

  def unpack(self, fmt: str) -> Any:
    value = struct.unpack_from(fmt, self.data, self.pos)[0]
    self.pos += struct.calcsize(fmt)
    return value

  def string(self) -> str:
    n = self.unpack("<Q")
    self.pos += n
    return self.data[self.pos - n:self.pos].decode("utf-8")

  def array(self, dtype: str, count: int) -> list:
    size = np.dtype(dtype).itemsize * count
    out = np.frombuffer(self.data[self.pos:self.pos + size], dtype).tolist()
    self.pos += size
    return out


def _value(cursor: _Cursor, kind: GGUFValueType) -> tuple[list, Any]:
  if kind == GGUFValueType.STRING:
    return [kind], cursor.string()
  if kind in _SCALARS:
    return [kind], cursor.array(_SCALARS[kind], 1)[0]
  if kind != GGUFValueType.ARRAY:
    raise ValueError(f"unknown GGUF value type {kind}")
  sub = GGUFValueType(cursor.unpack("<I"))
  count = cursor.unpack("<Q")
  if sub == GGUFValueType.STRING:
    return [kind, sub], [cursor.string() for _ in range(count)]
  if sub in _SCALARS:
    return [kind, sub], cursor.array(_SCALARS[sub], count)
  raise ValueError(f"nested GGUF arrays ({sub}) are not supported here")


def read_header(path: str | os.PathLike[str]) -> Header:
  """Metadata and tensor shapes of a GGUF file (no tensor data is read)."""
  with open(path, "rb") as f, mmap.mmap(f.fileno(), 0,
                                       access=mmap.ACCESS_READ) as data:
    return _parse(_Cursor(data), path)


def _parse(cursor: _Cursor, path) -> Header:
  if cursor.data[:4] != b"GGUF":
    raise ValueError(f"{path}: not a GGUF file")
  cursor.pos = 4
  version = cursor.unpack("<I")
  if version not in (2, 3):
    raise ValueError(f"{path}: GGUF version {version} is not supported here")
  num_tensors, num_fields = cursor.unpack("<Q"), cursor.unpack("<Q")
  fields = {}
  for _ in range(num_fields):
    key = cursor.string()
    types, value = _value(cursor, GGUFValueType(cursor.unpack("<I")))
    fields[key] = Field(types, value)
  tensors = []
  for _ in range(num_tensors):
    name = cursor.string()
    dims = tuple(cursor.unpack("<Q") for _ in range(cursor.unpack("<I")))
    cursor.pos += 4 + 8  # ggml type, data offset.
    tensors.append((name, dims))
  return Header(fields, tensors)
