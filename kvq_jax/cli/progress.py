"""A dependency-free progress bar on stderr."""

from __future__ import annotations

import sys
import time


class ProgressBar:

  def __init__(self, label: str, stream=None, width: int = 30):
    self.label, self.width = label, width
    self.stream = stream or sys.stderr
    self.start = time.perf_counter()

  def __call__(self, done: int, total: int) -> None:
    filled = int(self.width * done / max(total, 1))
    elapsed = time.perf_counter() - self.start
    # No ETA before the first step (it includes compilation): '?'.
    eta = (f"{elapsed / done * (total - done):5.1f}s" if done
           else f"{'?':>6}")
    self.stream.write(
        f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
        f"{done}/{total} {elapsed:6.1f}s elapsed, eta {eta}")
    if done >= total:
      self.stream.write("\n")
    self.stream.flush()
