"""This process's resident memory: its peak, resettable, and giving freed
heap back to the OS (Linux; elsewhere the peak is getrusage's, not
resettable, and nothing is released).

Why: a long run compiles many programs of growing size (one per context
length and cache) and glibc keeps freed heap, so "peak RSS so far" grows
with the run's history, not with what one step needs. `release_freed_memory`
(gc + `malloc_trim(0)`) and `reset_peak_rss` (`/proc/self/clear_refs` 5,
which resets VmHWM) before a phase make `peak_rss_gib` after it that
phase's own peak (the resident model and live programs included).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import resource

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def peak_rss_gib() -> float:
  """Peak resident set size, GiB: VmHWM (since the last `reset_peak_rss`)
  where /proc has it, else getrusage's ru_maxrss (process lifetime)."""
  try:
    with open(_STATUS, encoding="ascii") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 2**20  # kB -> GiB.
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def reset_peak_rss() -> bool:
  """Restarts the peak at the current RSS; False where the OS cannot."""
  try:
    with open(_CLEAR_REFS, "w", encoding="ascii") as f:
      f.write("5")
    return True
  except OSError:
    return False


def release_freed_memory() -> bool:
  """Collects garbage and returns glibc's freed heap to the OS; False where
  there is no glibc `malloc_trim`."""
  gc.collect()
  name = ctypes.util.find_library("c")
  if not name:
    return False
  try:
    trim = ctypes.CDLL(name).malloc_trim
  except (OSError, AttributeError):
    return False
  trim(0)
  return True
