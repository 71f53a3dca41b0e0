"""Jitted prefill / decode entry points over a Decoder.

`Runtime` splits the model once (graphdef + param state) and runs a pure
`nnx.merge(graphdef, state)(tokens, positions, cache)` under `jax.jit`, with
the graphdef bound by closure (see `jitted_steps`): one compiled
program per (B, T, cache kinds) shape, the cache buffers donated. The capacity
check runs eagerly, outside jit, before every call.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from kvq_jax.cache.base import LayerCache, check_capacity
from kvq_jax.cache.quantized_keys import check_positions
from kvq_jax.models.decoder import Decoder


def _positions_from_cache(cache: Sequence[LayerCache],
                          num_tokens: int) -> jax.Array:
  return (cache[0].length_B.astype(jnp.int32)[:, None]
          + jnp.arange(num_tokens, dtype=jnp.int32)[None, :])


def _check_positions(cache: Sequence[LayerCache],
                     positions_BxT: jax.Array) -> None:
  """Explicit positions vs pre-RoPE keys (eagerly, before the jitted call)."""
  for layer in cache:
    spec = getattr(layer, "spec", None)  # Quantized caches, rings included.
    if spec is not None:
      check_positions(spec, positions_BxT, layer.length_B)


def _forward(graphdef, state, tokens_BxT, cache, positions_BxT):
  model = nnx.merge(graphdef, state)
  if positions_BxT is None:
    positions_BxT = _positions_from_cache(cache, tokens_BxT.shape[1])
  return model(tokens_BxT, positions_BxT, cache)


def _chunk_tokens(tokens_BxT, cache: Sequence[LayerCache], what: str
                  ) -> jax.Array:
  """int32 [B, T] tokens that fit the cache (ValueError naming `what`)."""
  tokens_BxT = jnp.asarray(tokens_BxT, jnp.int32)
  if tokens_BxT.ndim != 2:
    raise ValueError(
        f"{what}: tokens must be [B, T]; got shape {tokens_BxT.shape}.")
  check_capacity(cache, tokens_BxT.shape[1])
  return tokens_BxT


def _prefill_last(graphdef, state, tokens_BxT, cache):
  model = nnx.merge(graphdef, state)
  positions_BxT = _positions_from_cache(cache, tokens_BxT.shape[1])
  x_BxTxD, new_cache = model.hidden(tokens_BxT, positions_BxT, cache)
  return model.logits(x_BxTxD[:, -1:])[:, 0], new_cache


def _decode(graphdef, state, token_B, cache, position_B):
  if position_B is None:
    positions_Bx1 = _positions_from_cache(cache, 1)
  else:
    positions_Bx1 = position_B[:, None]
  logits_Bx1xV, new_cache = _forward(graphdef, state, token_B[:, None], cache,
                                     positions_Bx1)
  return logits_Bx1xV[:, 0], new_cache


@functools.lru_cache(maxsize=32)
def jitted_steps(graphdef: nnx.GraphDef):
  """(forward, decode, prefill_last) jitted for one model structure, cache
  donated.

  Hashing a GraphDef walks the whole module tree (tens of ms for 30 layers),
  so it is bound here once instead of being a static jit argument per call.
  Signatures: forward(state, tokens_BxT, cache, positions_BxT | None) and
  decode(state, token_B, cache, position_B | None),
  prefill_last(state, tokens_BxT, cache).
  """
  forward = jax.jit(functools.partial(_forward, graphdef), donate_argnums=2)
  decode = jax.jit(functools.partial(_decode, graphdef), donate_argnums=2)
  last = jax.jit(functools.partial(_prefill_last, graphdef), donate_argnums=2)
  return forward, decode, last


class Runtime:
  """Compiled forward passes of a snapshot of `model`'s parameters.

  The parameters are captured at construction; build a new Runtime after
  `load_params` on the model. The cache passed in is donated: use the
  returned one afterwards, never the argument.
  """

  def __init__(self, model: Decoder):
    self.model = model
    self.config = model.config
    self.graphdef, self.state = nnx.split(model)
    self.forward_fn, self.decode_fn, self.prefill_last_fn = jitted_steps(
        self.graphdef)

  def init_cache(self, batch_size: int, capacity: int,
                 dtype=None) -> list[LayerCache]:
    return self.model.init_cache(batch_size, capacity, dtype)

  def prefill(self, tokens_BxT: jax.Array, cache: Sequence[LayerCache],
              positions_BxT: jax.Array | None = None
              ) -> tuple[jax.Array, list[LayerCache]]:
    """Runs a chunk of T tokens; positions default to length_b + [0, T).

    Returns float32 logits [B, T, V] and the cache with length + T.
    """
    tokens_BxT = _chunk_tokens(tokens_BxT, cache, "prefill")
    if positions_BxT is not None:
      positions_BxT = jnp.asarray(positions_BxT, jnp.int32)
      _check_positions(cache, positions_BxT)
    return self.forward_fn(self.state, tokens_BxT, list(cache), positions_BxT)

  def prefill_last(self, tokens_BxT: jax.Array, cache: Sequence[LayerCache]
                   ) -> tuple[jax.Array, list[LayerCache]]:
    """Like `prefill` (positions length_b + [0, T)), returning only the last
    position's float32 logits [B, V]: the output head runs on one position,
    not T (what a chunked prompt prefill needs)."""
    tokens_BxT = _chunk_tokens(tokens_BxT, cache, "prefill_last")
    return self.prefill_last_fn(self.state, tokens_BxT, list(cache))

  def decode(self, token_B: jax.Array, cache: Sequence[LayerCache],
             position_B: jax.Array | None = None
             ) -> tuple[jax.Array, list[LayerCache]]:
    """One token per sequence; returns float32 logits [B, V] and the cache."""
    token_B = jnp.asarray(token_B, jnp.int32)
    if token_B.ndim != 1:
      raise ValueError(
          f"decode: token must be [B]; got shape {token_B.shape}.")
    check_capacity(cache, 1)
    if position_B is not None:
      position_B = jnp.asarray(position_B, jnp.int32)
      _check_positions(cache, position_B[:, None])
    return self.decode_fn(self.state, token_B, list(cache), position_B)
