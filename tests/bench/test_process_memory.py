"""Peak RSS that a phase can reset, and freed heap given back."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from kvq_jax.bench import process_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="VmHWM and clear_refs are Linux /proc files")
def test_peak_is_reset_and_tracks_a_new_allocation():
  assert process_memory.release_freed_memory()  # glibc's malloc_trim.
  assert process_memory.reset_peak_rss()
  before = process_memory.peak_rss_gib()
  block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched.
  grown = process_memory.peak_rss_gib()
  assert grown - before >= 60 / 1024
  del block
  process_memory.release_freed_memory()
  assert process_memory.reset_peak_rss()
  # After the reset the peak is the current RSS, below the 64 MiB high.
  assert process_memory.peak_rss_gib() < grown - 30 / 1024

