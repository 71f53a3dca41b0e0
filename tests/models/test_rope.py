"""RoPE (HF rotate_half convention) against hand-computed values."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
import jax.numpy as jnp

from kvq_jax.models.rope import Rope


def test_rope_hand_computed_4dim_head():
  # head_dim 4, theta 1e4: inverse frequencies [1, 1e4^(-2/4)] = [1, 0.01].
  # Pairs rotated together: (x0, x2) at angle p, (x1, x3) at angle 0.01 p.
  # cos(1)=0.5403023059  sin(1)=0.8414709848
  # cos(.01)=0.9999500004 sin(.01)=0.0099998333
  # cos(2)=-0.4161468365 sin(2)=0.9092974268
  # cos(.02)=0.9998000067 sin(.02)=0.0199986667
  # out0 = x0 c - x2 s, out2 = x2 c + x0 s (angle p); out1, out3 likewise
  # at angle 0.01 p. E.g. p=1: out0 = 0.5403023 - 3 * 0.8414710 = -1.9841106.
  expected = np.array([
      [1.0, 2.0, 3.0, 4.0],                              # p = 0: identity
      [-1.9841106, 1.9599007, 2.4623779, 4.0197997],     # p = 1
      [-3.1440391, 1.9196053, -0.3391431, 4.0391973],    # p = 2
  ])
  rope = Rope(theta=10000.0, rotary_dim=4)
  x = jnp.broadcast_to(jnp.asarray([1.0, 2.0, 3.0, 4.0]), (1, 3, 1, 4))
  out = rope(x, jnp.asarray([[0, 1, 2]]))
  np.testing.assert_allclose(np.asarray(out)[0, :, 0], expected, atol=2e-6)


def test_rope_partial_rotary_dim_leaves_tail():
  rope = Rope(theta=10000.0, rotary_dim=4)
  x = jnp.arange(8, dtype=jnp.float32).reshape(1, 1, 1, 8) + 1
  out = np.asarray(rope(x, jnp.asarray([[7]])))
  np.testing.assert_array_equal(out[..., 4:], np.asarray(x)[..., 4:])
  assert not np.allclose(out[..., :4], np.asarray(x)[..., :4])


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 200), n=st.integers(0, 200), shift=st.integers(0, 300),
       seed=st.integers(0, 1000))
def test_rope_dot_product_depends_only_on_relative_position(m, n, shift, seed):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((1, 1, 1, 16)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((1, 1, 1, 16)), jnp.float32)
  rope = Rope(theta=10000.0, rotary_dim=16)

  def score(pq, pk):
    return float(jnp.sum(rope(q, jnp.asarray([[pq]]))
                         * rope(k, jnp.asarray([[pk]]))))

  np.testing.assert_allclose(score(m, n), score(m + shift, n + shift),
                             rtol=1e-3, atol=1e-3)


def test_rotations_compose_block_by_block():
  """q . R(s + l) k == R(-s) q . R(l) k: how the quantized caches read
  pre-RoPE keys (one offset table per block, the query rotated back by the
  block's start)."""
  rope = Rope(theta=10000.0, rotary_dim=48)  # Partial: 16 dims pass through.
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((64,)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((32, 64)), jnp.float32)
  start = 5000
  offsets = jnp.arange(32)
  want = rope(k[None, :, None, :], (start + offsets)[None])[0, :, 0] @ q
  got = (rope.rotate(k, *rope.cos_sin(offsets))
         @ rope.rotate(q, *rope.cos_sin(jnp.asarray(-start))))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-3,
                             atol=2e-3)
