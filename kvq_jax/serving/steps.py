"""The engine's two jitted programs over a paged model cache.

* `decode_step`: one token for every slot at once ([max_slots, 1]); slots
  not decoding (empty, or mid-prefill) are fed a dummy token and every
  per-slot leaf of theirs (lengths, windows, sinks, a ring buffer) is put
  back as it was, so the step cannot change their state. Their dummy rows
  may reach storage only at or past their committed end, which a later
  commit of their real tokens overwrites, or the null page. Then each
  slot's next token is picked: argmax, or drawn with fold_in(key(seed), i)
  as `models.generate` draws token i.
* `prefill_chunk`: T prompt tokens of one slot, cut out of the batch
  (`select_slots`), run, and put back (`merge_slots`): the last position's
  logits and the updated cache.
Both donate the cache and bind the graphdef by closure, like
`models.runtime.jitted_steps`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from kvq_jax.cache.paged.model import merge_slots, select_slots, slot_fields


def pick_tokens(logits_BxV, seed_B, step_B, temperature_B):
  """Per slot: argmax where temperature is 0, else a categorical draw from
  logits / T with key fold_in(key(seed), step) (`models.generate._pick`
  on a [1, V] row: the same draw)."""
  def one(logits_V, seed, step, temp):
    key = jax.random.fold_in(jax.random.key(seed), step)
    drawn = jax.random.categorical(
        key, logits_V[None] / jnp.where(temp > 0, temp, 1.0), axis=-1)[0]
    return jnp.where(temp > 0, drawn, jnp.argmax(logits_V)).astype(jnp.int32)
  return jax.vmap(one)(logits_BxV, seed_B, step_B, temperature_B)


pick = jax.jit(pick_tokens)


def _keep_inactive(old, new, active_B):
  """`new` with every per-slot leaf of the inactive slots taken from
  `old`."""
  def select(a, b):
    mask = active_B.reshape((-1,) + (1,) * (a.ndim - 1))
    return jnp.where(mask, b, a)
  updates = {name: jax.tree_util.tree_map(select, getattr(old, name),
                                          getattr(new, name))
             for name in slot_fields(new)}
  return new.replace(**updates)


def _decode_step(graphdef, state, cache, token_B, active_B, seed_B, step_B,
                 temperature_B):
  model = nnx.merge(graphdef, state)
  positions_Bx1 = cache[0].length_B[:, None]
  logits_Bx1xV, new = model(token_B[:, None], positions_Bx1, cache)
  new = [_keep_inactive(o, n, active_B) for o, n in zip(cache, new)]
  logits_BxV = logits_Bx1xV[:, 0]
  return (pick_tokens(logits_BxV, seed_B, step_B, temperature_B), logits_BxV,
          new)


def _prefill_chunk(graphdef, state, cache, tokens_1xT, slot_1):
  model = nnx.merge(graphdef, state)
  sub = select_slots(cache, slot_1)
  positions_1xT = (sub[0].length_B[:, None]
                   + jnp.arange(tokens_1xT.shape[1])[None, :])
  x_1xTxD, sub = model.hidden(tokens_1xT, positions_1xT, sub)
  logits_1xV = model.logits(x_1xTxD[:, -1:])[:, 0]
  return logits_1xV, merge_slots(cache, sub, slot_1)


@functools.lru_cache(maxsize=8)
def jitted(graphdef: nnx.GraphDef):
  """(decode_step, prefill_chunk) for one model structure, cache donated:
  decode_step(state, cache, token_B, active_B, seed_B, step_B,
  temperature_B) -> (next_B, logits_BxV, cache);
  prefill_chunk(state, cache, tokens_1xT, slot_1) -> (logits_1xV, cache).
  """
  decode = jax.jit(functools.partial(_decode_step, graphdef),
                   donate_argnums=1)
  prefill = jax.jit(functools.partial(_prefill_chunk, graphdef),
                    donate_argnums=1)
  return decode, prefill
