"""`make_mesh('DATAxMODEL')`: a 2-D ('data', 'model') device mesh.

'data' splits the batch (sequences / evaluation windows); 'model' splits
attention heads, KV heads and the MLP hidden dimension (tensor parallelism).
The mesh uses the first DATA * MODEL of `jax.devices()` (all *global*
devices: on a multi-process run, start it first (`sharding.distributed`);
the product must then equal the global device count, and since
`jax.devices()` lists each process's devices together, a MODEL of one
process's device count keeps 'model' inside a process).
"""

from __future__ import annotations

import re
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

AXES = ("data", "model")
_PATTERN = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_mesh_shape(text: str) -> tuple[int, int]:
  """'2x4' -> (2, 4); ValueError naming the value and the allowed form."""
  match = _PATTERN.match(text) if isinstance(text, str) else None
  if not match:
    raise ValueError(
        f"mesh={text!r}: allowed: 'DATAxMODEL' with two positive integers, "
        "e.g. '2x4' (2-way data parallel, 4-way model parallel).")
  data, model = int(match[1]), int(match[2])
  if data < 1 or model < 1:
    raise ValueError(
        f"mesh={text!r}: both sizes must be >= 1; got data={data}, "
        f"model={model}.")
  return data, model


def make_mesh(shape: str | tuple[int, int],
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'model') Mesh of shape DATA x MODEL.

  Args:
    shape: 'DATAxMODEL' (e.g. '2x4') or a (data, model) tuple.
    devices: defaults to `jax.devices()` (every global device).

  Raises:
    ValueError: malformed shape, or DATA * MODEL exceeds the device count (or,
      on a multi-process run, differs from it).
  """
  if isinstance(shape, (tuple, list)):
    if (len(shape) != 2 or not all(isinstance(s, int) and not isinstance(
        s, bool) and s >= 1 for s in shape)):
      raise ValueError(
          f"mesh={shape!r}: allowed: two positive integers (data, model).")
    data, model = shape
  else:
    data, model = parse_mesh_shape(shape)
  devices = list(jax.devices() if devices is None else devices)
  needed = data * model
  if needed > len(devices):
    raise ValueError(
        f"mesh={data}x{model} needs {needed} devices; only {len(devices)} "
        f"available ({devices[0].platform if devices else 'none'}); allowed: "
        f"DATA * MODEL <= {len(devices)}. On CPU, simulate devices with "
        "XLA_FLAGS=--xla_force_host_platform_device_count=N (set before jax "
        "starts).")
  if jax.process_count() > 1 and needed != len(devices):
    raise ValueError(
        f"mesh={data}x{model} uses {needed} of {len(devices)} global devices; "
        "a multi-process run must use every device: allowed DATA * MODEL == "
        f"{len(devices)}.")
  grid = np.asarray(devices[:needed], dtype=object).reshape(data, model)
  return Mesh(grid, AXES)


def axis_size(mesh: Mesh, name: str) -> int:
  return int(mesh.shape[name]) if name in mesh.axis_names else 1
