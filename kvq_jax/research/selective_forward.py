"""One jitted window forward over `SelectiveLayerCache`s, choices as data.

`SelectiveForward(decoder, specs)(tokens_BxT, k_choice_L, v_choice_L)`
returns float32 logits of fresh windows (empty cache of capacity T, one
prefill chunk, like `facade.window_forward`). The per-layer choices are int32
arrays, so a sweep over layers and formats compiles once per batch shape;
`num_traces` counts how often the Python function was traced.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from kvq_jax.models.decoder import Decoder
from kvq_jax.research.selective_cache import (SelectiveSpec,
                                              init_selective_cache)


class SelectiveForward:
  """See the module docstring."""

  def __init__(self, decoder: Decoder, specs: Sequence[SelectiveSpec]):
    if len(specs) != decoder.config.num_layers:
      raise ValueError(
          f"SelectiveForward: {len(specs)} SelectiveSpecs for a model with "
          f"num_layers={decoder.config.num_layers}.")
    self.config = decoder.config
    self.specs = tuple(specs)
    self.num_traces = 0
    graphdef, self._state = nnx.split(decoder)

    def forward(state, tokens_BxT, k_choice_L, v_choice_L, return_cache):
      self.num_traces += 1  # Python side effect: runs only when tracing.
      model = nnx.merge(graphdef, state)
      b, t = tokens_BxT.shape
      cache = init_selective_cache(model.config, self.specs, b, t,
                                   k_choice_L, v_choice_L)
      positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
      logits, new_cache = model(tokens_BxT, positions_BxT, cache)
      return (logits, new_cache) if return_cache else logits

    self._fn = jax.jit(forward, static_argnames="return_cache")

  def _args(self, tokens_BxT, k_choice_L, v_choice_L):
    num_layers = self.config.num_layers
    k = jnp.asarray(k_choice_L, jnp.int32)
    v = jnp.asarray(v_choice_L, jnp.int32)
    for name, arr, specs_count in (
        ("k_choice_L", k, [s.num_k_choices for s in self.specs]),
        ("v_choice_L", v, [s.num_v_choices for s in self.specs])):
      if arr.shape != (num_layers,):
        raise ValueError(
            f"SelectiveForward: {name} has shape {arr.shape}; allowed: "
            f"({num_layers},).")
      if not isinstance(arr, jax.core.Tracer):
        bad = [i for i, (c, n) in enumerate(zip(arr.tolist(), specs_count))
               if not 0 <= c < n]
        if bad:
          raise ValueError(
              f"SelectiveForward: {name}={arr.tolist()} is out of range at "
              f"layers {bad}; allowed per layer: 0..(number of candidate "
              "formats).")
    return self._state, jnp.asarray(tokens_BxT, jnp.int32), k, v

  def __call__(self, tokens_BxT, k_choice_L, v_choice_L) -> jax.Array:
    return self._fn(*self._args(tokens_BxT, k_choice_L, v_choice_L),
                    return_cache=False)

  def with_cache(self, tokens_BxT, k_choice_L, v_choice_L):
    """(logits, per-layer caches after the window)."""
    return self._fn(*self._args(tokens_BxT, k_choice_L, v_choice_L),
                    return_cache=True)
