"""Autoregressive generation: jitted prefill, then a jitted decode step loop."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kvq_jax.cache.factory import init_cache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.models.decoder import Decoder
from kvq_jax.models.runtime import Runtime


_CAPACITY_ROUNDING = 64


def default_capacity(num_prompt: int, max_new_tokens: int) -> int:
  """The cache slots `generate` allocates by default: prompt + new tokens
  rounded up to a multiple of 64, so prompts of similar length share
  compiled steps."""
  return -(-(num_prompt + max_new_tokens) // _CAPACITY_ROUNDING) * (
      _CAPACITY_ROUNDING)


@dataclasses.dataclass(frozen=True)
class Generation:
  prompt_ids: tuple[int, ...]
  new_ids: tuple[int, ...]  # Includes the eos token if one stopped it.
  text: str | None  # Decoded new_ids when a tokenizer was given.


@functools.partial(jax.jit, static_argnames="greedy")
def _pick(logits_BxV: jax.Array, key: jax.Array, temperature: jax.Array,
          *, greedy: bool) -> jax.Array:
  if greedy:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  return jax.random.categorical(key, logits_BxV / temperature,
                                axis=-1).astype(jnp.int32)


def generate(model: Decoder | Runtime, tokenizer: Any | None,
             prompt_ids: Sequence[int] | str, max_new_tokens: int, *,
             temperature: float = 0.0, seed: int = 0,
             eos_id: int | None = None,
             cache_dtype=None, cache_spec: CacheSpec | None = None,
             capacity: int | None = None) -> Generation:
  """Greedy (temperature 0) or sampled continuation of one prompt.

  Args:
    model: a Decoder or a Runtime built from one (reuse a Runtime to keep
      its compiled programs across calls).
    tokenizer: None, or an object with `encode(str) -> list[int]` (a
      `tokenizers.Encoding` with `.ids` also works) and `decode(ids)`
      (a `tokenizers.Tokenizer`); needed when `prompt_ids` is a string.
    prompt_ids: token ids, or text when a tokenizer is given.
    max_new_tokens: at most this many tokens are generated.
    temperature: 0 for argmax, > 0 to sample from softmax(logits / T).
    seed: PRNG seed; step i samples with fold_in(key(seed), i).
    eos_id: stop after emitting it; None uses `config.eos_token_id`.
    cache_dtype: the full-precision cache dtype (the dense cache's storage,
      what a quantized cache quantizes from); None means the compute dtype.
    cache_spec: None for the dense cache, else the quantized cache of this
      spec (`cache.factory.init_cache`), written by the same jitted prefill
      and decode steps.
    capacity: cache slots; None means `default_capacity`. Runs with the same
      prompt length, capacity and cache kind share compiled programs.
  """
  runtime = model if isinstance(model, Runtime) else Runtime(model)
  if isinstance(prompt_ids, str):
    if tokenizer is None:
      raise ValueError("generate: prompt_ids is text but tokenizer is None.")
    encoded = tokenizer.encode(prompt_ids)
    prompt_ids = list(getattr(encoded, "ids", encoded))
  prompt = tuple(int(t) for t in prompt_ids)
  if not prompt:
    raise ValueError("generate: prompt_ids is empty; need >= 1 token.")
  if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
    raise ValueError(
        f"generate: max_new_tokens={max_new_tokens!r}; must be an int >= 0.")
  if temperature < 0:
    raise ValueError(
        f"generate: temperature={temperature!r}; must be >= 0.")
  if eos_id is None:
    eos_id = runtime.config.eos_token_id
  needed = len(prompt) + max_new_tokens
  if capacity is None:
    capacity = default_capacity(len(prompt), max_new_tokens)
  elif isinstance(capacity, bool) or not isinstance(capacity, int) \
      or capacity < needed:
    raise ValueError(
        f"generate: capacity={capacity!r}; allowed: an int >= prompt + "
        f"max_new_tokens = {needed}.")
  if max_new_tokens == 0:
    return Generation(prompt, (), "" if tokenizer is not None else None)

  greedy = temperature == 0.0
  temp = jnp.float32(temperature if not greedy else 1.0)
  key = jax.random.key(seed)
  cache = init_cache(runtime.config, 1, capacity, cache_spec,
                     runtime.model.dtype if cache_dtype is None
                     else cache_dtype)
  logits_1xTxV, cache = runtime.prefill(jnp.asarray([prompt], jnp.int32),
                                        cache)
  logits_1xV = logits_1xTxV[:, -1]
  new_ids: list[int] = []
  for step in range(max_new_tokens):
    token_1 = _pick(logits_1xV, jax.random.fold_in(key, step), temp,
                    greedy=greedy)
    token = int(token_1[0])
    new_ids.append(token)
    if token == eos_id or step == max_new_tokens - 1:
      break
    logits_1xV, cache = runtime.decode(token_1, cache)
  text = tokenizer.decode(new_ids) if tokenizer is not None else None
  return Generation(prompt, tuple(new_ids), text)
