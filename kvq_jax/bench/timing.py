"""Wall-clock timing of jitted functions and a one-line machine description."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import statistics
import time
from typing import Any, Callable

import jax


def time_fn(fn: Callable[..., Any], *args: Any, repeats: int = 10,
            warmup: int = 2) -> float:
  """Median wall-clock seconds of `fn(*args)`, waiting for every result.

  The first `warmup` calls (compilation included) are not timed. Every output
  leaf is `block_until_ready`-ed, so asynchronous dispatch is not mistaken for
  speed.
  """
  if repeats < 1 or warmup < 0:
    raise ValueError(
        f"time_fn: repeats={repeats}, warmup={warmup}; allowed: repeats >= 1, "
        "warmup >= 0.")
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def machine_description() -> str:
  """Processor, OS, CPU count and JAX devices, for benchmark headers."""
  uname = platform.uname()
  processor = platform.processor() or uname.machine
  devices = ", ".join(str(d) for d in jax.devices())
  return (f"processor: {processor}; system: {uname.system} {uname.release} "
          f"({uname.machine}); cpus: {os.cpu_count()}; jax {jax.__version__} "
          f"devices: [{devices}]")


def write_measured(path: str | os.PathLike, payload: dict) -> pathlib.Path:
  """Writes {"machine": machine_description(), **payload} as JSON to
  `path` (parents created); returns the path."""
  out = pathlib.Path(path)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps({"machine": machine_description(), **payload},
                            indent=1), encoding="utf-8")
  return out
