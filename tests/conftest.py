"""Suite-wide hygiene: one test module's models and programs do not outlive it.

The README's command runs the suite in two pytest-xdist worker processes,
each test file whole on one worker (`-n 2 --dist loadfile`); each worker
runs many modules in turn. Real-checkpoint modules hold models of up to
6 GB (Qwen2.5-Coder-1.5B in float32) in module-scoped fixtures, and every module compiles its own XLA programs; on a
24 GiB, 2-core machine the accumulation once ended in an XLA compile
segfault late in the run. After each module, drop JAX's compilation caches
and collect garbage so the next module starts from what it allocates.
"""

from __future__ import annotations

import gc
import os

# Compile time dominates this suite (hundreds of small XLA programs). LLVM's
# expensive passes buy run time the tests do not need: measured 10% less
# wall time on tests/cache/test_split_flush.py + test_sliding_window.py
# (117.5 s vs 130.5 s, one run each), every pinned value unchanged. Set
# before the first use of a JAX backend, which reads XLA_FLAGS once.
os.environ["XLA_FLAGS"] = " ".join(
    filter(None, (os.environ.get("XLA_FLAGS", ""),
                  "--xla_llvm_disable_expensive_passes=true")))

import jax  # pylint: disable=wrong-import-position
import pytest  # pylint: disable=wrong-import-position


@pytest.fixture(scope="module", autouse=True)
def _release_module_memory():
  yield
  jax.clear_caches()
  gc.collect()
