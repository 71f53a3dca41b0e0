"""QuantizedLayerCache with k = v = None is exactly the dense cache.

At full precision the sink buffer, the residual window, pre-RoPE keys and the
Hadamard rotation must all be no-ops: the outputs equal DenseLayerCache's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.models.rope import Rope

B, K, G, H = 2, 2, 2, 16
CAPACITY = 40
CHUNKS = (9, 1, 6, 1, 13)  # Uneven, through flushes and several blocks.
ROPE = Rope(theta=10000.0, rotary_dim=H)

VARIANTS = {
    "plain": LayerSpec(k=None, v=None, block_size=16, window_dtype="float32"),
    "sink_residual_flush": LayerSpec(k=None, v=None, sink=3, residual=5,
                                     flush_k=4, flush_v=4, block_size=16,
                                     window_dtype="float32"),
    "pre_rope_hadamard_sink_residual": LayerSpec(
        k=None, v=None, sink=2, residual=3, flush_k=2, flush_v=2, key_rope="pre",
        hadamard_k=True, hadamard_v=True, block_size=8,
        window_dtype="float32"),
}


def _inputs(total: int):
  rng = np.random.default_rng(0)
  normal = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return (normal(B, total, K * G, H), normal(B, total, K, H),
          normal(B, total, K, H))


@jax.jit
def _run(cache, q, k, v):
  """Feeds the tokens in CHUNKS; returns all outputs [B, T, N, H]."""
  outs, pos = [], 0
  for size in CHUNKS:
    positions = cache.length_B[:, None] + jnp.arange(size)[None, :]
    out, cache = cache.attend(q[:, pos:pos + size], k[:, pos:pos + size],
                              v[:, pos:pos + size], positions, ROPE)
    outs.append(out)
    pos += size
  return jnp.concatenate(outs, axis=1), cache


@pytest.fixture(scope="module", name="dense_out")
def _dense_out():
  cache = DenseLayerCache.create(B, CAPACITY, K, H)
  out, _ = _run(cache, *_inputs(sum(CHUNKS)))
  return np.asarray(out)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_full_precision_quantized_path_equals_dense(name, dense_out):
  cache = QuantizedLayerCache.create(VARIANTS[name], B, CAPACITY, K, H)
  out, new = _run(cache, *_inputs(sum(CHUNKS)))
  np.testing.assert_allclose(np.asarray(out), dense_out, atol=1e-5, rtol=0)
  np.testing.assert_array_equal(np.asarray(new.length_B), [sum(CHUNKS)] * B)


def test_full_precision_model_logits_equal_dense():
  """Whole tiny decoder: every layer a full-precision QuantizedLayerCache."""
  from tests.cache import tiny_setup as ts
  spec = VARIANTS["pre_rope_hadamard_sink_residual"]
  config = ts.TINY1
  cache = [QuantizedLayerCache.create(spec, 2, ts.CAPACITY,
                                      config.num_kv_heads, config.head_dim)
           for _ in range(config.num_layers)]
  logits, _ = ts.run_chunks(ts.runtime("tiny1"), cache, ts.token_ids(),
                            (ts.SEQ_LEN,))
  np.testing.assert_allclose(logits, ts.dense_logits("tiny1"), atol=1e-5,
                             rtol=0)
