"""Reads tensors from (possibly sharded) .safetensors files as numpy arrays.

`safetensors.safe_open(framework="numpy")` is tried first; versions or dtypes
it cannot hand to numpy (bf16 on older releases, which numpy lacks natively)
fall back to parsing the file directly: an 8-byte little-endian header size,
a JSON header {name: {dtype, shape, data_offsets}}, then the raw bytes, with
BF16 viewed as `ml_dtypes.bfloat16`.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct

import ml_dtypes
import numpy as np
import safetensors

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32,
    "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


def read_raw_tensor(path: str | os.PathLike[str], name: str) -> np.ndarray:
  """Reads one tensor by parsing the safetensors layout (no library)."""
  path = os.fspath(path)
  with open(path, "rb") as f:
    size_bytes = f.read(8)
    if len(size_bytes) != 8:
      raise ValueError(f"safetensors file {path!r} is truncated (no header).")
    (header_size,) = struct.unpack("<Q", size_bytes)
    try:
      header = json.loads(f.read(header_size))
    except ValueError as e:
      raise ValueError(f"safetensors file {path!r}: corrupt header.") from e
    if name not in header:
      raise ValueError(f"safetensors file {path!r}: tensor {name!r} is missing.")
    info = header[name]
    dtype = _DTYPES.get(info["dtype"])
    if dtype is None:
      raise ValueError(f"safetensors file {path!r}: tensor {name!r} has dtype "
                       f"{info['dtype']!r}; allowed: {sorted(_DTYPES)}.")
    start, end = info["data_offsets"]
    f.seek(8 + header_size + start)
    data = f.read(end - start)
  if len(data) != end - start:
    raise ValueError(f"safetensors file {path!r}: tensor {name!r} is truncated.")
  return np.frombuffer(data, dtype=dtype).reshape(info["shape"])


class SafetensorsIndex:
  """Maps tensor names to the shard holding them; reads them as numpy."""

  def __init__(self, directory: str | os.PathLike[str]):
    directory = pathlib.Path(directory)
    self.directory = directory
    index = directory / "model.safetensors.index.json"
    if index.is_file():
      weight_map = json.loads(index.read_text())["weight_map"]
      files = sorted(set(weight_map.values()))
    else:
      files = sorted(p.name for p in directory.glob("*.safetensors"))
    if not files:
      raise ValueError(f"{str(directory)!r}: no *.safetensors files found.")
    self.where: dict[str, pathlib.Path] = {}
    for file in files:
      path = directory / file
      if not path.is_file():
        raise ValueError(f"{str(index)!r} names shard {file!r}, which does "
                         "not exist.")
      try:
        with safetensors.safe_open(str(path), framework="numpy") as f:
          names = list(f.keys())
      except Exception as e:  # pylint: disable=broad-except
        raise ValueError(f"safetensors file {str(path)!r} is unreadable: "
                         f"{e}") from e
      for name in names:
        if name in self.where:
          raise ValueError(f"tensor {name!r} is in both {str(path)!r} and "
                           f"{str(self.where[name])!r}.")
        self.where[name] = path

  def __contains__(self, name: str) -> bool:
    return name in self.where

  def names(self) -> set[str]:
    return set(self.where)

  def get(self, name: str) -> np.ndarray:
    """The tensor as stored (any dtype); ValueError naming file and tensor."""
    path = self.where.get(name)
    if path is None:
      raise ValueError(f"{str(self.directory)!r}: tensor {name!r} is missing "
                       "from the safetensors files.")
    try:
      with safetensors.safe_open(str(path), framework="numpy") as f:
        return f.get_tensor(name)
    except Exception:  # pylint: disable=broad-except
      return read_raw_tensor(path, name)
