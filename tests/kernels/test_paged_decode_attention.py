"""The paged Pallas decode kernel vs its jnp reference and the contiguous one.

Every case starts from a contiguous cache [B, K, M * P, H], quantized, whose
pages are then scattered at random into a pool of N pages (leaves held as
the paged store holds them: bf16 scales as uint16 bits, `pool_store`);
table entries past a sequence's pages are 0, the null page, whose scales
are poisoned with NaN: a kernel that read it would return NaN. Ends are
ragged (one sequence full, one empty) and starts cut into the first pages.
The paged reference must equal the contiguous reference on the contiguous
cache; the kernel must match them by relative L2 (1e-5 in the interpreter,
1e-3 compiled), and equal the contiguous kernel on the contiguous cache.
`TestPagedDecodeAttentionInterpret` runs both of the kernel's programs in
the interpreter ("gather", the Triton one, and "prefetch", the TPU one via
platform="tpu"); `TestPagedDecodeAttention` runs the backend's own program
compiled and skips on CPU. Few shapes: each interpreted case compiles.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.paged.store import pool_store
from kvq_jax.kernels.decode_attention import decode_attention
from kvq_jax.kernels.paged_decode_attention import (
    paged_decode_attention, paged_decode_attention_reference,
    paged_decode_attention_supported)
from kvq_jax.kernels.reference import decode_attention_reference
from kvq_jax.quant import QuantizedArray, QuantSpec, quantize
from tests.kernels.kernel_case import KernelCase

B, K, G, H, P, M, N = 3, 2, 3, 64, 16, 4, 16
END = (37, 64, 5)    # Ragged (a partial page), full, empty (start == end).
START = (18, 3, 5)   # Sequence 0 skips its whole first page.
PPB = 2              # Two splits of two pages per sequence.

# (key spec, value spec): int8 asymmetric per token, int4 symmetric with
# two groups along head_dim, int2 per-channel keys (KIVI, two token-group
# rows per page) with int2 symmetric values.
FORMATS = {
    "int8_asym_per_token": (QuantSpec("int8", "asymmetric", "per_token"),) * 2,
    "int4_sym_g32": (QuantSpec("int4", "symmetric", "per_group", 32),) * 2,
    "int2_per_channel_keys": (
        QuantSpec("int2", "asymmetric", "per_channel", 8, axis=-2),
        QuantSpec("int2", "symmetric", "per_group", 32)),
}


@functools.partial(jax.jit, static_argnums=1)
def _to_pool(x_BxKxSxH, spec, table_BxM):
  """Quantized contiguous cache -> (contiguous QuantizedArray, pool with
  its pages at table_BxM, 16-bit leaves as bits); one program."""
  xq = quantize(x_BxKxSxH, spec)

  def scatter(leaf):
    if leaf is None:
      return None
    rows = leaf.shape[2] // M
    pages = leaf.reshape(leaf.shape[:2] + (M, rows) + leaf.shape[3:])
    pages = jnp.moveaxis(pages, 2, 1).reshape((B * M, K, rows)
                                              + leaf.shape[3:])
    pool = jnp.zeros((N,) + pages.shape[1:], leaf.dtype)
    return pool.at[table_BxM.reshape(-1)].set(pages)

  pool = dataclasses.replace(xq, data=scatter(xq.data),
                             scale=scatter(xq.scale),
                             zero=scatter(xq.zero))
  return xq, pool_store(pool, spec)


def _poison_null_page(pool):
  nan = lambda a: None if a is None else a.at[0].set(
      0x7FC0 if a.dtype == jnp.uint16 else jnp.nan)  # bf16 NaN bits.
  return dataclasses.replace(pool, scale=nan(pool.scale), zero=nan(pool.zero))


@pytest.fixture(scope="module", name="cases")
def _cases():
  """name -> (q, contiguous k, v, pooled k, v (null page poisoned), table,
  end, start)."""
  rng = np.random.default_rng(0)
  full = rng.permutation(np.arange(1, N))[:B * M].reshape(B, M)
  pages_B = -(-np.asarray(END) // P)
  table = np.where(np.arange(M)[None, :] < pages_B[:, None], full, 0)
  full, table = jnp.asarray(full, jnp.int32), jnp.asarray(table, jnp.int32)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape),
                                      jnp.float32)
  q, k, v = normal(B, K, G, H), normal(B, K, M * P, H), normal(B, K, M * P, H)
  out = {}
  for name, (k_spec, v_spec) in FORMATS.items():
    kc, kp = _to_pool(k, k_spec, full)
    vc, vp = _to_pool(v, v_spec, full)
    out[name] = (q, kc, vc, kp, vp, table)
  return out, jnp.array(END, jnp.int32), jnp.array(START, jnp.int32)


def _rel_l2(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _assert_lse_close(lse, want, tol):
  np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want))
  finite = np.isfinite(np.asarray(want))
  np.testing.assert_allclose(np.asarray(lse)[finite],
                             np.asarray(want)[finite], rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(FORMATS))
def test_paged_reference_equals_contiguous_reference(cases, name):
  (q, kc, vc, kp, vp, table), end, start = cases[0][name], *cases[1:]
  want = decode_attention_reference(q, kc, vc, end, return_lse=True,
                                    start_B=start)
  assert kp.scale.dtype == jnp.uint16  # bf16 scales held as bits.
  got = paged_decode_attention_reference(q, kp, vp, table, end,
                                         start_B=start, page_size=P,
                                         return_lse=True)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


class TestPagedDecodeAttention(KernelCase):
  """See `KernelCase`."""

  def _platform(self, program: str):
    """The `platform` that runs `program` here, or skip."""
    if self.INTERPRET:
      return "tpu" if program == "prefetch" else None
    native = "prefetch" if jax.default_backend() == "tpu" else "gather"
    if program != native:
      pytest.skip(f"the {program} program is not this backend's.")
    return None

  @pytest.mark.parametrize("program", ["gather", "prefetch"])
  @pytest.mark.parametrize("name", list(FORMATS))
  def test_formats_scattered_pages(self, cases, name, program):
    (q, kc, vc, kp, vp, table), end, start = cases[0][name], *cases[1:]
    want, want_lse = decode_attention_reference(q, kc, vc, end,
                                                return_lse=True,
                                                start_B=start)
    out, lse = paged_decode_attention(
        q, _poison_null_page(kp), _poison_null_page(vp), table, end,
        start_B=start, page_size=P, pages_per_block=PPB,
        interpret=self.INTERPRET, platform=self._platform(program),
        return_lse=True)
    assert out.shape == q.shape and out.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(out)))
    assert _rel_l2(out, want) <= self.tol
    np.testing.assert_array_equal(out[2], 0.0)  # The empty sequence.
    _assert_lse_close(lse, want_lse, self.tol)

  def test_equals_contiguous_kernel(self, cases):
    (q, kc, vc, kp, vp, table), end, start = (
        cases[0]["int2_per_channel_keys"], *cases[1:])
    want = decode_attention(q, kc, vc, end, start_B=start, block_k=P,
                            k_splits=M // PPB, interpret=self.INTERPRET,
                            return_lse=True)
    got = paged_decode_attention(q, kp, vp, table, end, start_B=start,
                                 page_size=P, pages_per_block=PPB,
                                 interpret=self.INTERPRET, return_lse=True)
    assert _rel_l2(got[0], want[0]) <= self.tol
    _assert_lse_close(got[1], want[1], self.tol)


class TestPagedDecodeAttentionInterpret(TestPagedDecodeAttention):
  INTERPRET = True


def _qa(data, scale, spec):
  """A pool [N, K=1, P, H] with bf16 scales held as uint16 bits."""
  bits = jax.lax.bitcast_convert_type(jnp.asarray(scale, jnp.bfloat16),
                                      jnp.uint16)
  return QuantizedArray(jnp.asarray(data, jnp.uint8), bits, None, spec,
                        len(data[0][0][0]), "float32")


def test_hand_computed_pages():
  """Pool of 3 pages of P = 2 tokens, H = 2, int8 symmetric per token:
  x = (u - 128) * scale. Sequence 0's table [2, 1]: tokens 0, 1 in pool
  page 2, tokens 2, 3 in page 1; it sees [1, 3). Sequence 1 is empty.
  Page 0 (null) and the masked tokens hold huge values.
    token 1 key (0, 0), value (4, 0); token 2 key (1, 0), value (0, 8).
  q = (sqrt(2) ln 3, 0): scores / sqrt(2) = (0, ln 3), softmax (1/4, 3/4):
  out = (1, 6), lse = ln(1 + 3) = ln 4."""
  spec = QuantSpec("int8", "symmetric", "per_token")
  big = [[255, 255], [255, 255]]
  scale = [[[[100.0]] * 2], [[[1.0], [100.0]]], [[[100.0], [1.0]]]]
  k = _qa([[big], [[[129, 128], big[0]]], [[big[0], [128, 128]]]], scale,
          spec)
  v = _qa([[big], [[[128, 136], big[0]]], [[big[0], [132, 128]]]], scale,
          spec)
  q = jnp.array([[[[math.sqrt(2) * math.log(3), 0.0]]], [[[1.0, 1.0]]]])
  table = jnp.array([[2, 1], [0, 0]], jnp.int32)
  end, start = jnp.array([3, 0]), jnp.array([1, 0])
  for fn, kw in ((paged_decode_attention_reference, {}),
                 (paged_decode_attention, dict(interpret=True))):
    out, lse = fn(q, k, v, table, end, start_B=start, page_size=2,
                  return_lse=True, **kw)
    np.testing.assert_allclose(out, [[[[1.0, 6.0]]], [[[0.0, 0.0]]]],
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse[0], [[math.log(4)]], rtol=1e-6)
    assert np.isneginf(np.asarray(lse[1])).all()


# Validation runs no kernel: it is plain trace-time checking.


def _abstract_pools(spec, head_dim, page=P, pages=N):
  x = jnp.zeros((pages, K, page, head_dim))
  pool = jax.eval_shape(lambda a: pool_store(quantize(a, spec), spec), x)
  q = jax.ShapeDtypeStruct((B, K, G, head_dim), jnp.float32)
  return q, pool


def test_unsupported_inputs_say_why():
  int4 = QuantSpec("int4", "symmetric", "per_group", 32)
  q, pool = _abstract_pools(int4, H)
  table = jnp.zeros((B, M), jnp.int32)
  end = jnp.zeros((B,), jnp.int32)
  check = lambda *a, **kw: paged_decode_attention_supported(
      *a, **{"page_size": P, **kw})
  assert check(q, pool, pool, table, end) is None
  assert check(q, pool, pool, table, end, platform="cuda") is None
  assert "QuantizedArray page pools" in check(
      q, jnp.zeros((N, K, P, H)), pool, table, end)
  assert "page_size=8" in check(q, pool, pool, table, end, page_size=8)
  assert "pages_per_block=3" in check(q, pool, pool, table, end,
                                      pages_per_block=3)
  assert "block_table" in check(q, pool, pool, table[:1], end)
  assert "platform='rocm'" in check(q, pool, pool, table, end,
                                    platform="rocm")
  fp8 = QuantSpec("fp8_e4m3", "symmetric", "per_token")
  assert "fp8_e4m3" in check(q, *[_abstract_pools(fp8, H)[1]] * 2, table, end)
  # int2 at head_dim 32: 8-wide dots for Triton; fine on TPU.
  q32, int2 = _abstract_pools(QuantSpec("int2", "asymmetric", "per_group",
                                        32), 32)
  assert "tl.dot" in check(q32, int2, int2, table, end, platform="cuda")
  assert check(q32, int2, int2, table, end, platform="tpu") is None
  # 24-token pages: not a Triton block; the TPU reads whole pages.
  q, p24 = _abstract_pools(int4, H, page=24)
  assert "power of two" in check(q, p24, p24, table, end, page_size=24,
                                 platform="cuda")
  assert check(q, p24, p24, table, end, page_size=24, platform="tpu") is None
  concrete = pool_store(quantize(jnp.zeros((N, K, P, H)), int4), int4)
  with pytest.raises(ValueError, match="pages_per_block=3"):
    paged_decode_attention(jnp.zeros(q.shape), concrete, concrete, table,
                           end, page_size=P, pages_per_block=3,
                           interpret=True)
