"""Where a decode step's storage read spends its time (issue 15, item 4).

One layer's storage loop on synthetic K/V of `context` tokens (SmolLM2
shapes by default: K = 3 KV heads, G = 3 queries per KV head, H = 64), read
block by block as `QuantizedLayerCache` reads it (`slice_store`,
`read_store`, `block_attention`, `merge_states`), timed in two variants:

  * read:   slice + dequantize every block and reduce it to one number, no
            attention: the unpack / convert / scale work alone;
  * attend: the full loop as the cache runs it (dequantize, scores, online
            softmax, values; per-token formats with their scales folded out
            of the dots, `cache.folded_attention`; 2- and 4-bit formats read
            as bit planes, `quant.planes`);
  * attend_dequantized: the same loop dequantizing every block to one
            interleaved float32 block (the path before bit planes).

Per kind the rows give both times, the bytes the step reads (codes +
scales, or the full-precision buffer) and the bandwidth they imply, so a
layout that reads fewer bytes but spends longer converting them shows as
such. Kinds: 'bf16', 'float32' (dense buffers; any name of
`models.dtypes.DENSE_NAMES`) or any short format name
(`settings.short_specs`: int8, q4_0, int4_g32, int2_g32_asym, ...).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.bench.timing import time_fn
from kvq_jax.cache.attention import (block_attention, merge_states,
                                     planar_block_attention)
from kvq_jax.cache.folded_attention import folded_block_attention, folds_scales
from kvq_jax.cache.quantized_store import (read_planes, read_store,
                                           read_value_planes, slice_store)
from kvq_jax.cache.spec import to_cache_layout
from kvq_jax.models.dtypes import DENSE_NAMES, dense_dtype_name
from kvq_jax.quant import quantize
from kvq_jax.quant.accounting import nbytes
from kvq_jax.settings.short_specs import parse_short_spec


def _storage(kind: str, x_BxKxCxH: jax.Array):
  """(store, spec or None) of `kind` holding x."""
  if (dtype := dense_dtype_name(kind)) is not None:
    return x_BxKxCxH.astype(dtype), None
  spec = to_cache_layout(parse_short_spec(kind), kind)
  if spec is None:
    raise ValueError(f"read_profile: kind {kind!r} is full precision; "
                     f"allowed: {', '.join(DENSE_NAMES)} or a quantized "
                     "format.")
  return quantize(x_BxKxCxH, spec), spec


def _loops(num_blocks: int, block: int):
  def read(q, ks, kspec, vs, vspec):
    def body(i, acc):
      kb = read_store(slice_store(ks, i * block, block, kspec), kspec)
      vb = read_store(slice_store(vs, i * block, block, vspec), vspec)
      return acc + jnp.sum(kb) + jnp.sum(vb)
    return jax.lax.fori_loop(0, num_blocks, body, jnp.float32(0)) + q[0, 0,
                                                                       0, 0, 0]

  def attend_with(fold):
    def attend(q, ks, kspec, vs, vspec):
      b, k, g, t, h = q.shape
      folded = fold and folds_scales(kspec) and folds_scales(vspec)

      def body(i, state):
        kb, vb = (slice_store(ks, i * block, block, kspec),
                  slice_store(vs, i * block, block, vspec))
        mask = jnp.ones((b, t, block), bool)
        if folded:
          return merge_states(state, folded_block_attention(q, kb, vb, mask))
        if fold:  # The cache's path: bit planes where the format has them.
          v_planes, v_bad = read_value_planes(vb, vspec)
          return merge_states(state, planar_block_attention(
              q, read_planes(kb, kspec), v_planes, mask, v_bad))
        return merge_states(state, block_attention(
            q, read_store(kb, kspec), read_store(vb, vspec), mask))

      shape = (b, k, g, t)
      init = (jnp.full(shape, -1e30, jnp.float32), jnp.zeros(shape),
              jnp.zeros(shape + (h,)))
      _, l, acc = jax.lax.fori_loop(0, num_blocks, body, init)
      return acc / l[..., None]
    return attend

  return {"read": read, "attend": attend_with(True),
          "attend_dequantized": attend_with(False)}


def profile_storage_read(kinds, context: int, *, num_kv_heads: int = 3,
                         group: int = 3, head_dim: int = 64,
                         block: int = 256, repeats: int = 7,
                         seed: int = 0) -> list[dict]:
  """Rows (kind, context, bytes_read and, per variant of the module
  docstring, <variant>_ms and <variant>_gbps) for one layer's storage
  loop."""
  if context % block:
    raise ValueError(f"read_profile: context={context} is not a multiple of "
                     f"block={block}.")
  rng = np.random.default_rng(seed)
  shape = (1, num_kv_heads, context, head_dim)
  k = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  v = jnp.asarray(rng.standard_normal(shape), jnp.float32)
  q = jnp.asarray(rng.standard_normal((1, num_kv_heads, group, 1, head_dim)),
                  jnp.float32)
  loops = _loops(context // block, block)
  rows = []
  for kind in kinds:
    (ks, kspec), (vs, vspec) = _storage(kind, k), _storage(kind, v)
    size = sum(x.nbytes if spec is None else nbytes(x)
               for x, spec in ((ks, kspec), (vs, vspec)))
    row = {"kind": kind, "context": context, "block": block,
           "bytes_read": int(size)}
    for name, loop in loops.items():
      fn = jax.jit(lambda q, ks, vs, loop=loop: loop(q, ks, kspec, vs, vspec))
      seconds = time_fn(fn, q, ks, vs, repeats=repeats)
      row[f"{name}_ms"] = 1e3 * seconds
      row[f"{name}_gbps"] = size / seconds / 1e9
    rows.append(row)
  return rows
