"""Suite-wide hygiene: one test module's models and programs do not outlive it.

The whole suite runs in one process (`pytest -q tests`). Real-checkpoint
modules hold models of up to 6 GB (Qwen2.5-Coder-1.5B in float32) in
module-scoped fixtures, and every module compiles its own XLA programs; on a
24 GiB, 2-core machine the accumulation once ended in an XLA compile
segfault late in the run. After each module, drop JAX's compilation caches
and collect garbage so the next module starts from what it allocates.
"""

from __future__ import annotations

import gc

import jax
import pytest


@pytest.fixture(scope="module", autouse=True)
def _release_module_memory():
  yield
  jax.clear_caches()
  gc.collect()
