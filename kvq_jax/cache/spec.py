"""`CacheSpec`: how the KV cache of every layer is stored (frozen, hashable).

The quantized cache keeps keys and values heads-major, [B, K, S, H], so the
token axis of the stored tensors is -2: per_token / per_group specs group
along head_dim (axis -1) and per_channel specs group along the tokens
(axis -2, KIVI's per-channel keys). `CacheSpec` rewrites the user's
`QuantSpec.axis` into that layout (`layer(i)` returns the rewritten specs).

Full-precision regions (stored in `window_dtype`, bfloat16 by default, and
charged in every byte count; see `kvq_jax.capacity.memory`):
  * `sink`: the first S tokens of every sequence (KVQuant's attention sinks);
    dropped on sliding-window (local) layers, which never see a token past
    their window (`cache/sliding_quantized.py`).
  * `residual`: the most recent R tokens (KIVI). Older tokens are flushed into
    quantized storage in blocks of F tokens, F chosen per tensor (K and V
    separately): after n tokens a tensor's quantized region is [S, Q(n)) with
        Q(n) = S + F * floor(max(0, n - S - R) / F),
    so between R and R + F - 1 of its newest tokens stay full precision.
  F is `flush_block` when it is set (then for K and V alike), else the token
  group of a per-channel tensor (its groups must close before they are
  quantized) and 1 for a token-local one (per_token / per_group): with R = 0
  and S = 0 a token-local tensor is committed to quantized storage as it is
  written (llama.cpp) and holds no full-precision token at all. So kvq4-style
  per-channel keys with per-group values keep up to 31 keys in full
  precision and no value. An explicit F (and S) must be a multiple of every
  per-channel group size.

Decode attention over the storage (`attention_impl`): "xla" (a blockwise
online-softmax scan in jnp), "pallas" (the flash-decoding kernel of
`kvq_jax.kernels`, one query token only: prefill always uses the XLA path), or
an ordered tuple such as ("pallas", "xla") that falls back with a warning
where the kernel cannot run. An explicit "pallas" that cannot run raises.
`interpret` runs the kernel in the Pallas interpreter (None: exactly when the
default backend is the CPU, which has no Pallas lowering).

Vector codes in the XLA path (`code_read`): "dequantize" (default: each
block is reconstructed, then attended) or "lookup" (`cache/code_lookup.py`:
scores from a q . centroid table, values from a histogram of the attention
weights over the centroids; no dense copy of the block). "lookup" needs a
vector-coded tensor that it can read (values; keys only post-RoPE) and is
refused on sliding-window layers, whose ring is dequantized whole.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from kvq_jax.cache.code_lookup import CODE_READS, lookup_refusal
from kvq_jax.cache.key_affine import BOOK_MODES, KeyAffine
from kvq_jax.kernels.cache_layout import SUPPORTED_FORMATS
from kvq_jax.kernels.dispatch import normalize_implementation
from kvq_jax.quant import QuantSpec

KEY_ROPE = ("post", "pre")
WINDOW_DTYPES = ("bfloat16", "float16", "float32")
COMPONENT_ALLOCATIONS = ("greedy", "equal")

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


def to_cache_layout(spec: QuantSpec | None, name: str) -> QuantSpec | None:
  """`spec` with the axis of the [B, K, T, H] cache layout (ValueError
  naming `name` where it cannot be a cache format)."""
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


def _check_window_dtype(value) -> None:
  if value not in WINDOW_DTYPES:
    raise ValueError(
        f"CacheSpec.window_dtype={value!r}: allowed: "
        f"{', '.join(WINDOW_DTYPES)}.")


def _check_code_read(value) -> None:
  if value not in CODE_READS:
    raise ValueError(
        f"CacheSpec.code_read={value!r}: allowed: {', '.join(CODE_READS)}.")


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
  flush_k: int = 1
  flush_v: int = 1
  sink: int = 0
  key_rope: str = "post"
  hadamard_k: bool = False
  hadamard_v: bool = False
  rotation_key: tuple[int, int] | None = None
  key_affine: KeyAffine | None = None
  block_size: int = 256
  attention_impl: AttentionImpl = "xla"
  interpret: bool | None = None
  window_dtype: str = "bfloat16"
  code_read: str = "dequantize"

  def __post_init__(self):
    object.__setattr__(self, "attention_impl",
                       _attention_impl(self.attention_impl))
    _check_interpret(self.interpret)
    _check_window_dtype(self.window_dtype)
    _check_code_read(self.code_read)
    if self.code_read == "lookup":
      reason = lookup_refusal(self.k, self.v, self.key_rope)
      if reason:
        raise ValueError(f"LayerSpec.code_read='lookup': {reason}")
    small, large = sorted((self.flush_k, self.flush_v))
    if small < 1 or large % small:
      raise ValueError(
          f"LayerSpec: flush_k={self.flush_k}, flush_v={self.flush_v}: both "
          "must be >= 1 and one must divide the other.")

  @property
  def is_full_precision(self) -> bool:
    return self.k is None and self.v is None

  def looks_up(self, name: str) -> bool:
    """Whether tensor `name` ('k' or 'v') is read by lookup."""
    spec = self.k if name == "k" else self.v
    return (self.code_read == "lookup" and spec is not None
            and spec.is_vector)

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
      if spec.is_codebook:
        return (f"{name}.scheme={spec.scheme!r}: the decode kernel dequantizes "
                "with a scale and an offset, not a codebook lookup.")
      if not spec.has_scale:
        return (f"{name}.scheme='static': the decode kernel reads a stored "
                "scale per group, which a fixed-range format does not have.")
      if spec.outliers:
        return (f"{name}.outliers={spec.outliers}: the decode kernel does "
                "not write sparse outliers back.")
      if spec.format not in SUPPORTED_FORMATS:
        return (f"{name}.format={spec.format!r}: the decode kernel unpacks "
                "integer codes whose bit width divides 8; supported: "
                f"{', '.join(SUPPORTED_FORMATS)}.")
    return None

  def flush(self, name: str) -> int:
    """F of tensor `name` ('k' or 'v')."""
    return self.flush_k if name == "k" else self.flush_v

  def window_of(self, name: str) -> int:
    """Full-precision slots kept for tensor `name`'s newest tokens: R + F - 1."""
    return self.residual + self.flush(name) - 1

  @property
  def flush_block(self) -> int:
    """The larger F: the tensor that commits last (smallest Q(n))."""
    return max(self.flush_k, self.flush_v)

  @property
  def window(self) -> int:
    """The larger of the two full-precision windows, R + max(F_k, F_v) - 1."""
    return self.residual + self.flush_block - 1

  @property
  def full_precision_slots(self) -> dict[str, int]:
    """Full-precision slots per tensor ({'k': S + W_k, 'v': S + W_v})."""
    return {name: self.sink + self.window_of(name) for name in ("k", "v")}


@dataclasses.dataclass(frozen=True)
class CacheSpec:
  """Per-model cache configuration.

  Attributes:
    k, v: QuantSpec of keys / values for every layer; None = full precision.
    layer_overrides: ((layer, k_spec, v_spec), ...) replacing k/v for the
      named layers (None = full precision there).
    residual, flush_block, sink: full-precision regions (module docstring);
      flush_block None means: per tensor, its per-channel token group, or 1
      for a token-local tensor (committed as written).
    key_rope: "post" quantizes keys after RoPE; "pre" before it, RoPE being
      applied to the dequantized keys at read time (KVQuant).
    hadamard_k, hadamard_v: rotate head_dim by an orthonormal Hadamard matrix
      before quantization (undone exactly at read time).
    rotation_seed: None: the plain Hadamard H. An int: the randomised
      Hadamard D H, random signs D drawn per layer from (seed, layer index)
      (`kvq_jax.cache.hadamard`); needs hadamard_k or hadamard_v.
    key_affines: () or one `KeyAffine` per layer: calibrated per-channel
      shift and scale of the pre-RoPE keys (`kvq_jax.cache.key_affine`),
      applied before quantization and undone at read time; needs
      key_rope='pre'. Keys with scheme='static' (KVQuant: no scale per
      token, no full-precision window) need affines in range mode and
      hadamard_k False; values cannot be static. Where an affine carries a
      codebook for the static keys' bit width, `layer(i)` uses it as their
      levels; an affine in transform mode instead gives `layer(i)` one
      width per component for the keys' budget (`KeyAffine.component_widths`)
      and its codebooks for those widths.
    component_allocation: how a transform-mode affine spreads the keys'
      bits over the components: "greedy" (default: the calibrated error
      tables, `quant.bit_allocation.greedy_widths`) or "equal" (every
      component `k.bits` bits with the affine's codebook for that width:
      the basis without the allocation, an ablation).
    block_size: cache slots per block of the blockwise attention (XLA path);
      bounds the dequantized temporaries of a decode step.
    attention_impl: decode attention over the storage: "xla" | "pallas" | an
      ordered tuple of them (module docstring); lists become tuples.
    interpret: run the Pallas kernel in interpret mode; None = auto (on the
      cpu backend only).
    window_dtype: storage dtype of the full-precision regions (residual
      window, flush window, sinks): bfloat16 (default, as KIVI and Hugging
      Face keep their residual), float16 or float32.
    code_read: "dequantize" | "lookup": how the XLA path reads vector codes
      (module docstring).
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
  rotation_seed: int | None = None
  key_affines: tuple = ()
  block_size: int = 256
  attention_impl: AttentionImpl = "xla"
  interpret: bool | None = None
  window_dtype: str = "bfloat16"
  component_allocation: str = "greedy"
  code_read: str = "dequantize"

  def __post_init__(self):
    object.__setattr__(self, "attention_impl",
                       _attention_impl(self.attention_impl))
    _check_interpret(self.interpret)
    _check_window_dtype(self.window_dtype)
    _check_code_read(self.code_read)
    if self.component_allocation not in COMPONENT_ALLOCATIONS:
      raise ValueError(
          f"CacheSpec.component_allocation={self.component_allocation!r}: "
          f"allowed: {', '.join(COMPONENT_ALLOCATIONS)}.")
    seed = self.rotation_seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                             or seed < 0):
      raise ValueError(
          f"CacheSpec.rotation_seed={seed!r}: allowed: None (plain Hadamard) "
          "or an integer >= 0 (randomised Hadamard).")
    if seed is not None and not (self.hadamard_k or self.hadamard_v):
      raise ValueError(
          f"CacheSpec.rotation_seed={seed} rotates nothing: hadamard_k and "
          "hadamard_v are both False; allowed: set one of them, or "
          "rotation_seed=None.")
    object.__setattr__(self, "key_affines", tuple(self.key_affines))
    if self.key_affines:
      if not all(isinstance(a, KeyAffine) for a in self.key_affines):
        raise ValueError("CacheSpec.key_affines: allowed: () or one "
                         "KeyAffine per layer.")
      if self.key_rope != "pre":
        raise ValueError(
            f"CacheSpec.key_affines needs key_rope='pre' (a per-channel "
            f"shift does not commute with RoPE); got key_rope="
            f"{self.key_rope!r}.")
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
    flush = self.flush_block
    if flush is not None and (isinstance(flush, bool)
                              or not isinstance(flush, int) or flush < 1
                              or flush % needed):
      raise ValueError(
          f"CacheSpec.flush_block={self.flush_block!r}: must be a positive "
          f"multiple of the per-channel token group ({needed}), or None "
          "(per tensor: its per-channel group, 1 for token-local tensors).")
    if self.sink % needed or self.block_size % needed:
      raise ValueError(
          f"CacheSpec.sink={self.sink} and block_size={self.block_size} must "
          f"be multiples of the per-channel token group ({needed}).")
    for i, (k, v) in enumerate([(self.k, self.v)] + [o[1:] for o in overrides]):
      where = "" if i == 0 else f"layer_overrides[{i-1}]."
      to_cache_layout(k, f"{where}k")
      to_cache_layout(v, f"{where}v")
      self._check_static(k, v, where)
    if normalize_implementation(self.attention_impl) == ("pallas",):
      self._check_explicit_pallas(overrides)
    if self.code_read == "lookup":
      self._check_lookup(overrides)

  def _check_lookup(self, overrides) -> None:
    """code_read='lookup' needs vector codes it can read, and no others."""
    layers = [("k, v", self.k, self.v)] + [
        (f"layer_overrides[{i}]", k, v) for i, (_, k, v) in
        enumerate(overrides)]
    for where, k, v in layers:
      reason = lookup_refusal(k, v, self.key_rope)
      if reason:
        raise ValueError(f"CacheSpec.code_read='lookup' ({where}): {reason}")
    if not any(spec is not None and spec.is_vector
               for _, k, v in layers for spec in (k, v)):
      raise ValueError(
          "CacheSpec.code_read='lookup' reads vector codes, and no k or v "
          "here is scheme='vector' (e.g. int2_vq); allowed: such a format, "
          "or code_read='dequantize'.")

  def _check_static(self, k: QuantSpec | None, v: QuantSpec | None,
                    where: str) -> None:
    """scheme='static' is for keys, unrotated (module docstring)."""
    if v is not None and not v.has_scale:
      raise ValueError(
          f"CacheSpec.{where}v.scheme='static' has no calibrated ranges "
          "(only keys are calibrated: experiments.calibrate_keys "
          "--mode=range); allowed for values: every other scheme.")
    if k is not None and not k.has_scale and self.hadamard_k:
      raise ValueError(
          f"CacheSpec.{where}k.scheme='static' quantizes each key channel "
          "in its calibrated range, which hadamard_k would mix; allowed: "
          "hadamard_k=False.")

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

  def check_num_layers(self, num_layers: int) -> None:
    """ValueError if a layer override names a layer the model does not have,
    the key affines are not one per layer, or static keys lack affines in
    range mode (checked here, when the cache is built, so a preset can be
    loaded to calibrate them)."""
    static = [s for s in self._all_specs() if s is not None and not s.has_scale]
    if static and (not self.key_affines
                   or any(a.mode not in BOOK_MODES for a in self.key_affines)):
      raise ValueError(
          "CacheSpec: keys with scheme='static' need key_affines calibrated "
          "in range mode (cache.key_stats from `experiments.calibrate_keys "
          "--mode=range`), which map each key channel's range to [-1, 1], "
          "or in transform mode (--mode=transform --rotation=pca); "
          f"got {len(self.key_affines)} affines, modes "
          f"{sorted({a.mode for a in self.key_affines})}.")
    if self.key_affines and len(self.key_affines) != num_layers:
      raise ValueError(
          f"CacheSpec.key_affines has {len(self.key_affines)} entries, the "
          f"model {num_layers} layers; allowed: one per layer (calibrate the "
          "keys of this model).")
    for layer, _, _ in self.layer_overrides:
      if layer >= num_layers:
        raise ValueError(
            f"CacheSpec.layer_overrides names layer {layer}, but the model "
            f"has {num_layers} layers; allowed: 0..{num_layers - 1}.")

  def _flush(self, spec: QuantSpec | None) -> int:
    if self.flush_block is not None:
      return self.flush_block
    return _channel_group(spec)

  def key_format(self, k: QuantSpec | None, index: int) -> QuantSpec | None:
    """Key format `k` (user layout) as layer `index` stores it: with key
    affines, a static key gets its calibrated codebook, or under
    component_allocation='greedy' in transform mode a width per component
    with a codebook per width. Used for the layer's own format and for
    every format a sensitivity probe tries there
    (`research.selective_cache.layer_specs`)."""
    if not self.key_affines or k is None:
      return k
    affine = self.key_affines[index]
    widths = (affine.component_widths(k.bits)
              if self.component_allocation == "greedy"
              and not k.has_scale and not k.component_bits else None)
    if widths is not None:  # Transform coding: a width per component.
      books = tuple((w, affine.levels(w)) for w in sorted(set(widths))
                    if w and affine.levels(w))
      return dataclasses.replace(k, levels=(), component_bits=widths,
                                 width_levels=books)
    if not k.has_scale and not k.levels and affine.levels(k.bits):
      return dataclasses.replace(k, levels=affine.levels(k.bits))
    return k

  def layer(self, index: int) -> LayerSpec:
    k, v = self.k, self.v
    for layer, ko, vo in self.layer_overrides:
      if layer == index:
        k, v = ko, vo
    shared = {f.name: getattr(self, f.name)
              for f in dataclasses.fields(LayerSpec)
              if f.name not in ("k", "v", "flush_k", "flush_v",
                                "rotation_key", "key_affine")}
    key = None if self.rotation_seed is None else (self.rotation_seed, index)
    affine = (self.key_affines[index] if self.key_affines and k is not None
              else None)
    k = self.key_format(k, index)
    return LayerSpec(k=to_cache_layout(k, "k"), v=to_cache_layout(v, "v"),
                     flush_k=self._flush(k), flush_v=self._flush(v),
                     rotation_key=key, key_affine=affine, **shared)
