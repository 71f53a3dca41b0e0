"""The key and query path of a quantized layer cache (`cache/quantized.py`).

Incoming keys and values go into the stored convention (`incoming_tokens`:
keys rotated by RoPE unless key_rope == 'pre', normalized by the calibrated
key affine, Hadamard-rotated where the spec asks); queries are scaled and
rotated like the keys they are dotted with (`scaled_queries`); stored keys
come back as keys to dot with the query (`keys_for_scores`,
`pre_rope_key_planes`: pre-RoPE keys rotated by their slot index, their
Hadamard rotation and key affine undone); the attention output has the
value rotation undone (`attention_output`). Also the checks a layer makes
of what it is handed: positions of pre-RoPE keys (`check_positions`) and
the key affine's shape (`check_key_affine`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.cache import hadamard
from kvq_jax.cache.quantized_store import Store, read_planes, read_store
from kvq_jax.cache.spec import LayerSpec
from kvq_jax.models.rope import Rope
from kvq_jax.quant.planes import plane_count


def check_positions(spec: LayerSpec, positions_BxT, length_B) -> None:
  """ValueError if pre-RoPE keys would be rotated by the wrong positions.

  With key_rope='pre' the cache rotates a stored key by its slot index at
  read time, so token t of sequence b must sit at position length_b + t.
  Only concrete (non-traced) arrays are checked.
  """
  if spec.key_rope != "pre" or isinstance(positions_BxT, jax.core.Tracer) \
      or isinstance(length_B, jax.core.Tracer):
    return
  positions = np.asarray(positions_BxT)
  expected = (np.asarray(length_B)[:, None]
              + np.arange(positions.shape[1])[None, :])
  if not np.array_equal(positions, expected):
    raise ValueError(
        "key_rope='pre' rotates stored keys by their slot index, so the "
        "positions must equal length_b + [0, T) (got positions "
        f"{positions.tolist()[:2]}..., expected {expected.tolist()[:2]}...); "
        "use key_rope='post' for arbitrary positions.")


def pre_rope_key_planes(spec: LayerSpec, kb: Store, rope: Rope,
                        cos_L: jax.Array, sin_L: jax.Array):
  """A block of stored pre-RoPE keys, each rotated by its offset l in the
  block ((cos, sin) [L, rotary_dim/2] of the offsets): as bit planes, each
  turned by its strided angles (`Rope.rotate`), when the keys need nothing
  else undone and the pairs stay inside a plane; else as one plane."""
  p = plane_count(spec.k)
  if (p > 1 and not spec.hadamard_k and spec.key_affine is None
      and cos_L.shape[-1] % p == 0):
    planes = read_planes(kb, spec.k)
    return tuple(rope.rotate(x, cos_L[:, j::p], sin_L[:, j::p])
                 for j, x in enumerate(planes))
  return (rope.rotate(unrotated_keys(spec, read_store(kb, spec.k)), cos_L,
                      sin_L),)


def incoming_tokens(spec: LayerSpec, k_BxTxKxH: jax.Array,
                    v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
                    rope: Rope) -> tuple[jax.Array, jax.Array]:
  """The T new keys and values in the stored convention, [B, K, T, H] f32.

  Keys are rotated by RoPE unless key_rope == 'pre', shifted and scaled by
  the calibrated key affine if any; keys / values are Hadamard-rotated where
  the spec asks.
  """
  k_new = k_BxTxKxH if spec.key_rope == "pre" else rope(k_BxTxKxH,
                                                        positions_BxT)
  k_new_BxKxTxH = jnp.swapaxes(k_new, 1, 2).astype(jnp.float32)
  v_new_BxKxTxH = jnp.swapaxes(v_BxTxKxH, 1, 2).astype(jnp.float32)
  if spec.key_affine is not None:
    k_new_BxKxTxH = spec.key_affine.normalize(k_new_BxKxTxH)
  if spec.hadamard_k:
    k_new_BxKxTxH = hadamard.rotate(k_new_BxKxTxH, spec.rotation_key)
  if spec.hadamard_v:
    v_new_BxKxTxH = hadamard.rotate(v_new_BxKxTxH, spec.rotation_key)
  return k_new_BxKxTxH, v_new_BxKxTxH


def scaled_queries(spec: LayerSpec, q_BxTxNxH: jax.Array,
                   num_kv_heads: int) -> jax.Array:
  """q [B, K, G, T, H] float32, scaled by 1/sqrt(H), rotated like the keys
  it is dotted with (Hadamard, for post-RoPE rotated keys)."""
  b, t, n, h = q_BxTxNxH.shape
  q = q_BxTxNxH.astype(jnp.float32) * (h ** -0.5)
  if spec.hadamard_k and spec.key_rope == "post":
    q = hadamard.rotate(q, spec.rotation_key)
  return jnp.moveaxis(q.reshape(b, t, num_kv_heads, n // num_kv_heads, h), 1,
                      3)


def attention_output(spec: LayerSpec, state, q_BxTxNxH: jax.Array
                     ) -> jax.Array:
  """out_BxTxNxH in q's dtype from a merged softmax state (m, l, acc)."""
  b, t, n, h = q_BxTxNxH.shape
  _, l, acc = state
  out_BxKxGxTxH = acc / l[..., None]
  if spec.hadamard_v:
    out_BxKxGxTxH = hadamard.unrotate(out_BxKxGxTxH, spec.rotation_key)
  out = jnp.moveaxis(out_BxKxGxTxH, 3, 1).reshape(b, t, n, h)
  return out.astype(q_BxTxNxH.dtype)


def keys_for_scores(spec: LayerSpec, k_BxKxLxH: jax.Array,
                    tokens_BxL: jax.Array, rope: Rope) -> jax.Array:
  """Stored-convention keys -> keys to dot with the (rotated) query.

  Pre-RoPE keys are rotated by their token index (== position, see
  `check_positions`), after undoing their Hadamard rotation.
  """
  if spec.key_rope == "pre":
    k_BxLxKxH = rope(jnp.swapaxes(unrotated_keys(spec, k_BxKxLxH), 1, 2),
                     tokens_BxL)
    return jnp.swapaxes(k_BxLxKxH, 1, 2).astype(jnp.float32)
  return k_BxKxLxH


def unrotated_keys(spec: LayerSpec, k_BxKxLxH: jax.Array) -> jax.Array:
  """Stored pre-RoPE keys with their Hadamard rotation and key affine
  undone: the keys RoPE is applied to."""
  if spec.hadamard_k:
    k_BxKxLxH = hadamard.unrotate(k_BxKxLxH, spec.rotation_key)
  if spec.key_affine is not None:
    k_BxKxLxH = spec.key_affine.denormalize(k_BxKxLxH)
  return k_BxKxLxH


def check_key_affine(spec: LayerSpec, num_kv_heads: int,
                     head_dim: int) -> None:
  """ValueError if the layer's key affine was calibrated for other shapes."""
  affine = spec.key_affine
  if affine is not None and affine.shape != (num_kv_heads, head_dim):
    raise ValueError(
        f"key affine of shape {affine.shape} for a cache of {num_kv_heads} kv "
        f"heads x head_dim {head_dim}: calibrated for another model; "
        "allowed: key stats calibrated on this model.")
