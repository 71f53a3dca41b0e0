"""The llama.cpp Q/K permutation: exact inverse, and it preserves attention."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.loaders import rope_permutation
from kvq_jax.models.rope import Rope


@settings(max_examples=30, deadline=None)
@given(n_head=st.integers(1, 4), half=st.integers(1, 4), cols=st.integers(0, 3))
def test_unpermute_inverts_permute(n_head, half, cols):
  shape = (n_head * 2 * half,) + ((cols,) if cols else ())
  w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  p = rope_permutation.permute_rows(w, n_head)
  assert np.array_equal(rope_permutation.unpermute_rows(p, n_head), w)
  assert np.array_equal(rope_permutation.permute_rows(
      rope_permutation.unpermute_rows(w, n_head), n_head), w)


def test_matches_convert_hf_to_gguf_formula_on_one_head():
  # One head, head_dim 4: HF rows [a0 a1 b0 b1] (pairs (a_i, b_i)) become
  # llama.cpp's interleaved rows [a0 b0 a1 b1].
  w = np.arange(4, dtype=np.float32)
  assert rope_permutation.permute_rows(w, 1).tolist() == [0, 2, 1, 3]


def _interleaved_rope(x_TxNxH, positions, theta):
  """llama.cpp's rope: rotates adjacent pairs (x[2i], x[2i+1])."""
  h = x_TxNxH.shape[-1]
  inv = 1.0 / theta ** (np.arange(0, h, 2) / h)
  ang = positions[:, None, None] * inv
  even, odd = x_TxNxH[..., 0::2], x_TxNxH[..., 1::2]
  out = np.empty_like(x_TxNxH)
  out[..., 0::2] = even * np.cos(ang) - odd * np.sin(ang)
  out[..., 1::2] = odd * np.cos(ang) + even * np.sin(ang)
  return out


@pytest.mark.parametrize("n_head", [1, 3])
def test_llamacpp_rope_on_permuted_equals_hf_rope(n_head):
  head_dim, d, t, theta = 8, 6, 5, 10000.0
  rng = np.random.default_rng(1)
  w_hf = rng.standard_normal((n_head * head_dim, d))
  x = rng.standard_normal((t, d))
  positions = np.arange(t, dtype=np.float64) * 3
  q_hf = (x @ w_hf.T).reshape(1, t, n_head, head_dim)
  rope = Rope(theta=theta, rotary_dim=head_dim)
  hf = np.asarray(rope(jnp.asarray(q_hf, jnp.float32),
                       jnp.asarray(positions[None], jnp.int32)))[0]
  w_cpp = rope_permutation.permute_rows(w_hf, n_head)
  q_cpp = (x @ w_cpp.T).reshape(t, n_head, head_dim)
  cpp = _interleaved_rope(q_cpp, positions, theta)
  back = rope_permutation.unpermute_rows(
      cpp.reshape(t, -1).T, n_head).T.reshape(t, n_head, head_dim)
  np.testing.assert_allclose(back, hf, rtol=1e-4, atol=1e-4)


def test_rejects_rows_not_divisible():
  with pytest.raises(ValueError, match="n_head=3"):
    rope_permutation.unpermute_rows(np.zeros(8), 3)
