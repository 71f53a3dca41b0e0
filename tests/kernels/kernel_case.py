"""The base of every Pallas kernel test class: compiled on a GPU/TPU, and
again under `INTERPRET = True` (a subclass) so CPU CI covers the kernel."""

from __future__ import annotations

import jax
import pytest


class KernelCase:
  """`INTERPRET = False` runs the compiled kernel (skipped on CPU, where
  the Interpret subclass runs it); `tol` is `TOLERANCE[INTERPRET]`."""

  INTERPRET = False
  TOLERANCE = {True: 1e-5, False: 1e-3}

  @pytest.fixture(autouse=True)
  def _needs_device_unless_interpreted(self):
    if not self.INTERPRET and jax.default_backend() == "cpu":
      pytest.skip("Compiled Pallas needs a GPU/TPU; see the Interpret class.")

  @property
  def tol(self) -> float:
    return self.TOLERANCE[self.INTERPRET]
