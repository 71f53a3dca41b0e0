"""experiments.profile_read's library call on a small context."""

from __future__ import annotations

import pytest

from kvq_jax.bench.read_profile import profile_storage_read


def test_rows_count_the_bytes_each_layout_reads():
  rows = profile_storage_read(["bf16", "float32", "int8", "q4_0"], 512,
                              repeats=1)
  got = {r["kind"]: r for r in rows}
  elements = 2 * 3 * 512 * 64  # K and V, 3 heads, 512 tokens, H = 64.
  assert got["float32"]["bytes_read"] == 4 * elements
  assert got["bf16"]["bytes_read"] == 2 * elements
  # int8: one byte per element + a bfloat16 scale per 64-element vector;
  # q4_0: half a byte + a float16 scale per 32 elements.
  assert got["int8"]["bytes_read"] == elements + 2 * elements // 64
  assert got["q4_0"]["bytes_read"] == elements // 2 + 2 * elements // 32
  for r in rows:
    assert r["read_ms"] > 0 and r["attend_ms"] > 0
    assert r["read_gbps"] == pytest.approx(
        r["bytes_read"] / r["read_ms"] / 1e6)


def test_full_precision_format_names_are_refused():
  with pytest.raises(ValueError, match="full precision"):
    profile_storage_read(["fp"], 256, repeats=1)
  with pytest.raises(ValueError, match="multiple of block"):
    profile_storage_read(["int8"], 300, repeats=1)
