"""Recording q, k, v of every layer from a full-precision forward pass.

`RecordingLayerCache` satisfies the per-layer cache contract
(`kvq_jax/cache/base.py`) for one chunk written into an empty cache: it
attends exactly like the dense baseline and keeps the chunk's rotated
queries, the keys before and after RoPE and the values as leaves, so the
returned cache list carries what every layer saw.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from kvq_jax.cache import init_layer_caches
from kvq_jax.cache.attention import attention_mask, gqa_attention
from kvq_jax.models.rope import Rope


@struct.dataclass
class RecordingLayerCache:
  """Dense attention over one chunk; records q (post-RoPE), k, v.

  Shapes: q [B, T, N, H], k_pre / k_post / v [B, T, K, H]; T = capacity.
  """

  q_BxTxNxH: jax.Array
  k_pre_BxTxKxH: jax.Array
  k_post_BxTxKxH: jax.Array
  v_BxTxKxH: jax.Array
  length_B: jax.Array
  capacity: int = struct.field(pytree_node=False)

  @classmethod
  def create(cls, batch_size: int, capacity: int, num_heads: int,
             num_kv_heads: int, head_dim: int) -> RecordingLayerCache:
    kv = jnp.zeros((batch_size, capacity, num_kv_heads, head_dim), jnp.float32)
    return cls(
        q_BxTxNxH=jnp.zeros((batch_size, capacity, num_heads, head_dim),
                            jnp.float32),
        k_pre_BxTxKxH=kv, k_post_BxTxKxH=kv, v_BxTxKxH=kv,
        length_B=jnp.zeros((batch_size,), jnp.int32), capacity=capacity)

  def attend(self, q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array,
             v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
             rope: Rope) -> tuple[jax.Array, RecordingLayerCache]:
    t = q_BxTxNxH.shape[1]
    if t != self.capacity:
      raise ValueError(
          f"RecordingLayerCache records one chunk filling the cache: chunk "
          f"of {t} tokens, capacity {self.capacity}; allowed: equal.")
    k_post = rope(k_BxTxKxH, positions_BxT)
    mask_BxTxS = attention_mask(self.length_B, t, t)
    out = gqa_attention(q_BxTxNxH, k_post, v_BxTxKxH, mask_BxTxS)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    return out, self.replace(
        q_BxTxNxH=f32(q_BxTxNxH), k_pre_BxTxKxH=f32(k_BxTxKxH),
        k_post_BxTxKxH=f32(k_post), v_BxTxKxH=f32(v_BxTxKxH),
        length_B=self.length_B + t)


@dataclasses.dataclass(frozen=True)
class LayerRecord:
  """What one layer saw on the calibration windows (numpy, float32)."""

  q_BxTxNxH: np.ndarray
  k_pre_BxTxKxH: np.ndarray
  k_post_BxTxKxH: np.ndarray
  v_BxTxKxH: np.ndarray


@functools.lru_cache(maxsize=4)
def _recorder(graphdef):
  def forward(state, tokens_BxT):
    model = nnx.merge(graphdef, state)
    cfg = model.config
    b, t = tokens_BxT.shape
    cache = init_layer_caches(cfg, lambda _: RecordingLayerCache.create(
        b, t, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim))
    positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    _, cache = model(tokens_BxT, positions_BxT, cache)
    return [(c.q_BxTxNxH, c.k_pre_BxTxKxH, c.k_post_BxTxKxH, c.v_BxTxKxH)
            for c in cache]
  return jax.jit(forward)


def record_qkv(model, windows_WxT: np.ndarray,
               batch_size: int = 1) -> list[LayerRecord]:
  """Per-layer q/k/v of a full-precision forward over `windows_WxT`.

  `model` is a `kvq_jax.facade.LoadedModel`; windows are independent
  sequences (positions 0..T-1), processed `batch_size` at a time.
  """
  graphdef, state = model.split
  fn = _recorder(graphdef)
  parts = []
  for start in range(0, len(windows_WxT), batch_size):
    batch = jnp.asarray(windows_WxT[start:start + batch_size], jnp.int32)
    parts.append([tuple(np.asarray(a) for a in layer)
                  for layer in fn(state, batch)])
  return [LayerRecord(*(np.concatenate([p[i][j] for p in parts])
                        for j in range(4)))
          for i in range(len(parts[0]))]
