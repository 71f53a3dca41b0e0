"""`CacheSpec`: how the KV cache of every layer is stored (frozen, hashable).

The quantized cache keeps keys and values heads-major, [B, K, S, H], so the
token axis of the stored tensors is -2: per_token / per_group specs group
along head_dim (axis -1) and per_channel specs group along the tokens
(axis -2, KIVI's per-channel keys). `CacheSpec` rewrites the user's
`QuantSpec.axis` into that layout (`layer(i)` returns the rewritten specs).

Full-precision regions (all in the compute dtype):
  * `sink`: the first S tokens of every sequence (KVQuant's attention sinks).
  * `residual`: the most recent R tokens (KIVI). Older tokens are flushed into
    quantized storage in blocks of `flush_block` tokens: after n tokens the
    quantized region is [S, Q(n)) with
        Q(n) = S + F * floor(max(0, n - S - R) / F),
    so between R and R + F - 1 of the newest tokens stay full precision.
    R = 0, F = 1 quantizes every token as it is written (llama.cpp).
  Per-channel groups must close before they are quantized, so F (and S) must
  be multiples of every per-channel group size.

Decode attention over the storage (`attention_impl`): "xla" (a blockwise
online-softmax scan in jnp), "pallas" (the flash-decoding kernel of
`kvq_jax.kernels`, one query token only: prefill always uses the XLA path), or
an ordered tuple such as ("pallas", "xla") that falls back with a warning
where the kernel cannot run. An explicit "pallas" that cannot run raises.
`interpret` runs the kernel in the Pallas interpreter (None: exactly when the
default backend is the CPU, which has no Pallas lowering).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from kvq_jax.kernels.cache_layout import SUPPORTED_FORMATS
from kvq_jax.kernels.dispatch import normalize_implementation
from kvq_jax.quant import QuantSpec

KEY_ROPE = ("post", "pre")

AttentionImpl = str | tuple[str, ...]


def _attention_impl(value: str | Sequence[str]) -> AttentionImpl:
  """Validated, hashable `attention_impl`: a name or a tuple of names."""
  if not isinstance(value, (str, tuple, list)):
    raise ValueError(
        f"CacheSpec.attention_impl={value!r}: allowed: 'xla', 'pallas' or a "
        "non-empty ordered tuple of them, e.g. ('pallas', 'xla').")
  choices = normalize_implementation(value, "CacheSpec.attention_impl")
  return value if isinstance(value, str) else choices


def _check_interpret(value) -> None:
  if value is not None and not isinstance(value, bool):
    raise ValueError(
        f"CacheSpec.interpret={value!r}: allowed: True, False or None (auto: "
        "interpret on the cpu backend).")


def _to_cache_layout(spec: QuantSpec | None, name: str) -> QuantSpec | None:
  if spec is None:
    return None
  if spec.granularity == "per_channel":
    axis = -2
  elif spec.granularity == "per_tensor":
    axis = None
  else:
    if spec.axis not in (None, -1):
      raise ValueError(
          f"CacheSpec.{name}.axis={spec.axis}: {spec.granularity} cache "
          "quantization groups along head_dim; allowed: None or -1.")
    axis = None
  if spec.granularity == "per_tensor":
    raise ValueError(
        f"CacheSpec.{name}.granularity='per_tensor' would need a scale over "
        "tokens not yet written; allowed: per_token, per_group, per_channel.")
  return dataclasses.replace(spec, axis=axis)


def _channel_group(spec: QuantSpec | None) -> int:
  if spec is not None and spec.granularity == "per_channel":
    if spec.group_size is None:
      raise ValueError(
          "CacheSpec: per_channel cache quantization needs a token group_size "
          "(e.g. 32); None (the whole token axis) cannot be streamed.")
    return spec.group_size
  return 1


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """What one layer's cache stores; `k`/`v` None mean full precision."""

  k: QuantSpec | None
  v: QuantSpec | None
  residual: int = 0
  flush_block: int = 1
  sink: int = 0
  key_rope: str = "post"
  hadamard_k: bool = False
  hadamard_v: bool = False
  block_size: int = 256
  attention_impl: AttentionImpl = "xla"
  interpret: bool | None = None

  def __post_init__(self):
    object.__setattr__(self, "attention_impl",
                       _attention_impl(self.attention_impl))
    _check_interpret(self.interpret)

  @property
  def is_full_precision(self) -> bool:
    return self.k is None and self.v is None

  @property
  def attention_choices(self) -> tuple[str, ...]:
    """`attention_impl` as an ordered tuple of names."""
    return normalize_implementation(self.attention_impl)

  def pallas_static_reason(self) -> str | None:
    """Why the decode kernel can never read this layer's storage, or None.

    Shape- and backend-dependent reasons are checked at trace time by
    `kvq_jax.kernels.dispatch.pallas_unsupported_reason`.
    """
    if self.key_rope == "pre":
      return ("key_rope='pre' stores keys before RoPE, which must then be "
              "applied to the dequantized keys at read time; the decode "
              "kernel dots the query with the stored keys directly and "
              "cannot rotate them (use key_rope='post' or attention_impl="
              "'xla').")
    if self.k is None or self.v is None:
      return ("only one of k/v is quantized; the decode kernel reads packed "
              "QuantizedArray storage for both.")
    for name, spec in (("k", self.k), ("v", self.v)):
      if spec.format not in SUPPORTED_FORMATS:
        return (f"{name}.format={spec.format!r}: the decode kernel unpacks "
                "integer codes whose bit width divides 8; supported: "
                f"{', '.join(SUPPORTED_FORMATS)}.")
    return None

  @property
  def window(self) -> int:
    """Full-precision slots kept for the newest tokens: R + F - 1."""
    return self.residual + self.flush_block - 1


@dataclasses.dataclass(frozen=True)
class CacheSpec:
  """Per-model cache configuration.

  Attributes:
    k, v: QuantSpec of keys / values for every layer; None = full precision.
    layer_overrides: ((layer, k_spec, v_spec), ...) replacing k/v for the
      named layers (None = full precision there).
    residual, flush_block, sink: full-precision regions (module docstring);
      flush_block None means the largest per-channel group size, else 1.
    key_rope: "post" quantizes keys after RoPE; "pre" before it, RoPE being
      applied to the dequantized keys at read time (KVQuant).
    hadamard_k, hadamard_v: rotate head_dim by an orthonormal Hadamard matrix
      before quantization (undone exactly at read time).
    block_size: cache slots per block of the blockwise attention (XLA path);
      bounds the dequantized temporaries of a decode step.
    attention_impl: decode attention over the storage: "xla" | "pallas" | an
      ordered tuple of them (module docstring); lists become tuples.
    interpret: run the Pallas kernel in interpret mode; None = auto (on the
      cpu backend only).
  """

  k: QuantSpec | None = None
  v: QuantSpec | None = None
  layer_overrides: tuple = ()
  residual: int = 0
  flush_block: int | None = None
  sink: int = 0
  key_rope: str = "post"
  hadamard_k: bool = False
  hadamard_v: bool = False
  block_size: int = 256
  attention_impl: AttentionImpl = "xla"
  interpret: bool | None = None

  def __post_init__(self):
    object.__setattr__(self, "attention_impl",
                       _attention_impl(self.attention_impl))
    _check_interpret(self.interpret)
    for name in ("residual", "sink"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        raise ValueError(
            f"CacheSpec.{name}={value!r}: allowed: an integer >= 0.")
    if self.key_rope not in KEY_ROPE:
      raise ValueError(
          f"CacheSpec.key_rope={self.key_rope!r}: allowed: post, pre.")
    if not isinstance(self.block_size, int) or self.block_size < 1:
      raise ValueError(
          f"CacheSpec.block_size={self.block_size!r}: allowed: an integer >= 1.")
    overrides = []
    for entry in self.layer_overrides:
      if len(entry) != 3 or not isinstance(entry[0], int) or entry[0] < 0:
        raise ValueError(
            f"CacheSpec.layer_overrides entry {entry!r}: allowed: "
            "(layer_index >= 0, k_spec or None, v_spec or None).")
      overrides.append((entry[0], entry[1], entry[2]))
    layers = [o[0] for o in overrides]
    if len(set(layers)) != len(layers):
      raise ValueError(
          f"CacheSpec.layer_overrides names a layer twice: {layers}.")
    object.__setattr__(self, "layer_overrides", tuple(overrides))
    groups = [_channel_group(s) for s in self._all_specs()]
    needed = math.lcm(*groups) if groups else 1
    flush = self.flush_block if self.flush_block is not None else needed
    if not isinstance(flush, int) or flush < 1 or flush % needed:
      raise ValueError(
          f"CacheSpec.flush_block={self.flush_block!r}: must be a positive "
          f"multiple of the per-channel token group ({needed}).")
    if self.sink % needed or self.block_size % needed:
      raise ValueError(
          f"CacheSpec.sink={self.sink} and block_size={self.block_size} must "
          f"be multiples of the per-channel token group ({needed}).")
    object.__setattr__(self, "flush_block", flush)
    for i, (k, v) in enumerate([(self.k, self.v)] + [o[1:] for o in overrides]):
      _to_cache_layout(k, "k" if i == 0 else f"layer_overrides[{i-1}].k")
      _to_cache_layout(v, "v" if i == 0 else f"layer_overrides[{i-1}].v")
    if normalize_implementation(self.attention_impl) == ("pallas",):
      self._check_explicit_pallas(overrides)

  def _check_explicit_pallas(self, overrides) -> None:
    """attention_impl='pallas' on a cache the kernel can never read."""
    layers = [("", self.k, self.v)] + [
        (f" (layer_overrides, layer {i})", k, v) for i, k, v in overrides]
    for where, k, v in layers:
      if k is None and v is None:
        continue  # A full-precision layer uses the dense cache.
      probe = LayerSpec(k=k, v=v, key_rope=self.key_rope)
      reason = probe.pallas_static_reason()
      if reason:
        raise ValueError(
            f"CacheSpec.attention_impl='pallas' is unsupported{where}: "
            f"{reason} Use 'xla' or a fallback tuple ('pallas', 'xla').")

  def _all_specs(self):
    specs = [self.k, self.v]
    for _, k, v in self.layer_overrides:
      specs += [k, v]
    return specs

  def layer(self, index: int) -> LayerSpec:
    k, v = self.k, self.v
    for layer, ko, vo in self.layer_overrides:
      if layer == index:
        k, v = ko, vo
    shared = {f.name: getattr(self, f.name)
              for f in dataclasses.fields(LayerSpec)
              if f.name not in ("k", "v")}
    return LayerSpec(k=_to_cache_layout(k, "k"), v=_to_cache_layout(v, "v"),
                     **shared)
