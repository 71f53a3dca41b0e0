"""Checks shared by the block-attention variants' tests."""

from __future__ import annotations

import numpy as np


def assert_state_equals_with_nan_value_row(got, want) -> None:
  """`got` == `want` (partial softmax states) to 1e-5, and the value row of
  sequence 1, head 0 whose scale was set to NaN (visible to query 1 only)
  reaches query 1 and not query 0."""
  for w, g in zip(want, got):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5,
                               atol=1e-5)
  acc = np.asarray(got[2])
  assert np.isnan(acc[1, 0, :, 1]).all()  # Query 1 sees the NaN row...
  assert np.isfinite(acc[1, 0, :, 0]).all()  # ...query 0 does not.
