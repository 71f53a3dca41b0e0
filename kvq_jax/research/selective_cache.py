"""`SelectiveLayerCache`: one layer's cache whose format choice is data.

A sensitivity sweep quantizes one layer (or all but one) at a time. With the
real caches every such mix is a different pytree structure and therefore a
new compilation. Here every layer stores full-precision, post-RoPE K/V like
`DenseLayerCache`, and the *choice* of format is an int32 leaf per tensor:

  k_choice / v_choice = 0  -> full precision (exactly `DenseLayerCache`),
  k_choice / v_choice = i  -> `spec.k_formats[i - 1]` / `spec.v_formats[i - 1]`,

applied at write time as a quantize -> dequantize round trip
(`research.fake_quant`, via `lax.switch`, so only the chosen branch runs).
The candidate formats are static; the choices vary per call without
recompiling. For token-local specs (per_token / per_group along head_dim)
and no residual window this is exactly what `QuantizedLayerCache` reads
back; anything else raises ValueError on construction. Sinks are emulated:
while a layer quantizes K or V (a choice > 0), the tokens at positions <
`sink` of both tensors take the cache's sink path (a cast to the window
dtype) instead of the round trip.

Storage is float32 whatever the cache dtype: the full-precision choice rounds
to the cache dtype and back, a quantized choice rounds to it before
quantizing, as the real caches do, and dequantized values are kept in float32
as `QuantizedLayerCache` reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import struct

from kvq_jax.cache import init_layer_caches
from kvq_jax.cache.dense import write_and_attend
from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import KEY_ROPE, CacheSpec
from kvq_jax.models.config import ModelConfig
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec
from kvq_jax.research import fake_quant

FULL_PRECISION = 0  # The choice index of the full-precision branch.


@dataclasses.dataclass(frozen=True)
class SelectiveSpec:
  """Static part of a `SelectiveLayerCache` (hashable pytree aux data).

  Attributes:
    k_formats, v_formats: candidate specs (cache layout, axis None); choice
      i >= 1 selects entry i - 1. A None entry is full precision.
    key_rope: 'post' or 'pre' (fake-quantize keys before RoPE).
    hadamard_k, hadamard_v: rotate head_dim around the round trip.
    rotation_key: the randomised rotation's (seed, layer); None: plain H.
    key_affine: calibrated pre-RoPE key shift/scale (key_rope 'pre').
    dtype: the full-precision cache dtype (a jnp dtype name).
    sliding_window: the layer's sliding window (Gemma 3 local layers), or
      None: a band mask over the linear storage (not a ring: this cache is
      a quality probe, not a memory measurement).
    sink, window_dtype: the first `sink` tokens kept in `window_dtype`
      while the layer quantizes (module docstring); a sliding-window layer
      keeps none, as the ring cache.
  """

  k_formats: tuple[QuantSpec | None, ...]
  v_formats: tuple[QuantSpec | None, ...]
  key_rope: str = "post"
  hadamard_k: bool = False
  hadamard_v: bool = False
  rotation_key: tuple[int, int] | None = None
  key_affine: KeyAffine | None = None
  dtype: str = "float32"
  sliding_window: int | None = None
  sink: int = 0
  window_dtype: str = "bfloat16"

  def __post_init__(self):
    for name in ("k_formats", "v_formats"):
      formats = tuple(getattr(self, name))
      object.__setattr__(self, name, formats)
      for i, spec in enumerate(formats):
        fake_quant.check_token_local(spec, f"SelectiveSpec.{name}[{i}]")
        if spec is not None and spec.axis not in (None, -1):
          raise ValueError(
              f"SelectiveSpec.{name}[{i}].axis={spec.axis}: token-local "
              "groups run along head_dim; allowed: None or -1.")
    if self.key_rope not in KEY_ROPE:
      raise ValueError(
          f"SelectiveSpec.key_rope={self.key_rope!r}: allowed: "
          f"{', '.join(KEY_ROPE)}.")
    object.__setattr__(self, "dtype", jnp.dtype(self.dtype).name)
    if self.sliding_window is not None:
      object.__setattr__(self, "sink", 0)

  @property
  def num_k_choices(self) -> int:
    return len(self.k_formats) + 1

  @property
  def num_v_choices(self) -> int:
    return len(self.v_formats) + 1


@struct.dataclass
class SelectiveLayerCache:
  """Post-RoPE K/V [B, S=capacity, K, H] in float32 plus the format choice."""

  k_BxSxKxH: jax.Array
  v_BxSxKxH: jax.Array
  length_B: jax.Array  # int32 [B]
  k_choice: jax.Array  # int32 []: 0 = full precision, i = k_formats[i - 1].
  v_choice: jax.Array  # int32 []
  capacity: int = struct.field(pytree_node=False)
  spec: SelectiveSpec = struct.field(pytree_node=False)

  @classmethod
  def create(cls, spec: SelectiveSpec, batch_size: int, capacity: int,
             num_kv_heads: int, head_dim: int, k_choice=FULL_PRECISION,
             v_choice=FULL_PRECISION) -> SelectiveLayerCache:
    for name, value in (("batch_size", batch_size), ("capacity", capacity),
                        ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim)):
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"SelectiveLayerCache.{name}={value!r}: must be a positive "
            "integer.")
    for name, value, count in (("k_choice", k_choice, spec.num_k_choices),
                               ("v_choice", v_choice, spec.num_v_choices)):
      if isinstance(value, int) and not 0 <= value < count:
        raise ValueError(
            f"SelectiveLayerCache.{name}={value}: allowed: 0 (full "
            f"precision) .. {count - 1} (the candidate formats).")
    shape = (batch_size, capacity, num_kv_heads, head_dim)
    return cls(k_BxSxKxH=jnp.zeros(shape, jnp.float32),
               v_BxSxKxH=jnp.zeros(shape, jnp.float32),
               length_B=jnp.zeros((batch_size,), jnp.int32),
               k_choice=jnp.asarray(k_choice, jnp.int32),
               v_choice=jnp.asarray(v_choice, jnp.int32),
               capacity=capacity, spec=spec)

  def _keys(self, k_BxTxKxH, positions_BxT, rope: Rope, spec_or_none,
            window_dtype=None):
    s = self.spec
    return fake_quant.keys(k_BxTxKxH, positions_BxT, rope, spec_or_none,
                           s.dtype, s.key_rope, s.hadamard_k, s.rotation_key,
                           s.key_affine, window_dtype)

  def _values(self, v_BxTxKxH, spec_or_none, window_dtype=None):
    s = self.spec
    return fake_quant.values(v_BxTxKxH, spec_or_none, s.dtype, s.hadamard_v,
                             s.rotation_key, window_dtype)

  def _with_sinks(self, written_BxTxKxH, sink_BxTxKxH, positions_BxT):
    """Sink positions take the sink copy while the layer quantizes."""
    quantizing = (self.k_choice != FULL_PRECISION) | (
        self.v_choice != FULL_PRECISION)
    use = quantizing & (positions_BxT < self.spec.sink)
    return jnp.where(use[:, :, None, None], sink_BxTxKxH, written_BxTxKxH)

  def _written_keys(self, k_BxTxKxH, positions_BxT, rope: Rope):
    spec = self.spec
    branches = [(lambda k, p, s=s: self._keys(k, p, rope, s))
                for s in (None,) + spec.k_formats]
    out = jax.lax.switch(self.k_choice, branches, k_BxTxKxH, positions_BxT)
    if not spec.sink:
      return out
    return self._with_sinks(out, self._keys(
        k_BxTxKxH, positions_BxT, rope, None, spec.window_dtype),
                            positions_BxT)

  def _written_values(self, v_BxTxKxH, positions_BxT):
    spec = self.spec
    branches = [(lambda v, s=s: self._values(v, s))
                for s in (None,) + spec.v_formats]
    out = jax.lax.switch(self.v_choice, branches, v_BxTxKxH)
    if not spec.sink:
      return out
    return self._with_sinks(out, self._values(v_BxTxKxH, None,
                                              spec.window_dtype),
                            positions_BxT)

  def attend(self, q_BxTxNxH: jax.Array, k_BxTxKxH: jax.Array,
             v_BxTxKxH: jax.Array, positions_BxT: jax.Array,
             rope: Rope) -> tuple[jax.Array, SelectiveLayerCache]:
    """Writes the T new tokens (round-tripped), then attends over the cache."""
    return write_and_attend(
        self, q_BxTxNxH, self._written_keys(k_BxTxKxH, positions_BxT, rope),
        self._written_values(v_BxTxKxH, positions_BxT),
        self.spec.sliding_window)


def layer_specs(config: ModelConfig, spec: CacheSpec,
                extra_k: Sequence[QuantSpec | None] = (),
                extra_v: Sequence[QuantSpec | None] = (),
                dtype="float32") -> list[SelectiveSpec]:
  """Per-layer `SelectiveSpec`s: choice 1 is `spec`'s own format there.

  Choices 2, 3, ... are `extra_k` / `extra_v` (the same for every layer).
  Raises ValueError where `spec` cannot be emulated exactly (module
  docstring).
  """
  out = []
  for i in range(config.num_layers):
    layer = spec.layer(i)
    fake_quant.check_emulable(layer, f"CacheSpec (layer {i})")
    out.append(SelectiveSpec(
        k_formats=(layer.k,) + tuple(extra_k),
        v_formats=(layer.v,) + tuple(extra_v),
        key_rope=layer.key_rope, hadamard_k=layer.hadamard_k,
        hadamard_v=layer.hadamard_v, rotation_key=layer.rotation_key,
        key_affine=layer.key_affine,
        dtype=dtype,
        sliding_window=config.layer_window(i), sink=layer.sink,
        window_dtype=layer.window_dtype))
  return out


def init_selective_cache(config: ModelConfig, specs: Sequence[SelectiveSpec],
                         batch_size: int, capacity: int, k_choice_L,
                         v_choice_L) -> list[SelectiveLayerCache]:
  """One `SelectiveLayerCache` per layer; choices are int32 [L] (traced ok)."""
  if len(specs) != config.num_layers:
    raise ValueError(
        f"init_selective_cache: {len(specs)} SelectiveSpecs for a model with "
        f"num_layers={config.num_layers}; allowed: exactly one per layer.")
  k_choice_L = jnp.asarray(k_choice_L, jnp.int32)
  v_choice_L = jnp.asarray(v_choice_L, jnp.int32)
  for name, arr in (("k_choice_L", k_choice_L), ("v_choice_L", v_choice_L)):
    if arr.shape != (config.num_layers,):
      raise ValueError(
          f"init_selective_cache: {name} has shape {arr.shape}; allowed: "
          f"({config.num_layers},), one choice per layer.")
  return init_layer_caches(config, lambda i: SelectiveLayerCache.create(
      specs[i], batch_size, capacity, config.num_kv_heads, config.head_dim,
      k_choice_L[i], v_choice_L[i]))
