"""Flash-decoding Pallas kernel over the packed (quantized) KV cache.

One query token per sequence attends to a heads-major cache [B, K, S, H]. The
grid is (B, K, k_splits): each program owns one KV head of one sequence and one
contiguous split of S / k_splits slots, keeps all G query heads of that KV head
in one [G, H] block (grouped-query attention), and runs an online softmax over
blocks of `block_k` slots, stopping at the sequence's length. The splits are
merged afterwards in jnp by log-sum-exp, as in jax's
`jax/experimental/pallas/ops/gpu/decode_attention.py`.

Packed codes are unpacked inside the kernel with shifts and masks
(uint8 -> int32 -> float32). To avoid an in-kernel interleave, a byte is read
as `parts = 8 / bits` code planes (plane j holds elements h = parts * i + j):
the query is split into the key's planes outside the kernel, the scores are
the sum of the per-plane dot products, and the output is produced per value
plane and interleaved back outside.

Masking: sequence b sees the slots [start_b, length_b) (start_b = 0 unless
given; the quantized cache passes its sink count, whose slots live in a
separate full-precision buffer). Blocks wholly before start_b are skipped.
An empty range returns zeros and lse = -inf, without NaN.

Targets (`platform`, static; None: the default backend, and a CPU host
without `interpret` lowers for CUDA): "cuda" lowers through Triton (query
heads padded to 16 for tl.dot; every dot needs >= 16 elements along its
contraction, so an int2 plane needs head_dim >= 64); "tpu" through Mosaic:
lengths and starts by scalar prefetch (SMEM), grid dimension semantics
("parallel", "parallel", "arbitrary"), query heads padded to the 8
sublanes, and every block's last two dims either the array's own or
multiples of (8, 128). Per-channel (token-group) scales reach the kernel
split into code planes, [B, K, S/gt, parts, H/parts], so neither target
needs a strided load and their blocks' last two dims are whole. Cross-
lowering from a CPU host (`jax.jit(...).trace(...).lower(
lowering_platforms=(platform,))`) needs nothing else about the device;
`decode_attention_supported(..., platform=...)` says why a shape or
format cannot be served there.

The block loop, the dequantization and the split merge are
`flash_parts.py`'s, shared with the paged kernel
(`paged_decode_attention.py`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp

from kvq_jax.kernels import flash_parts as fp
from kvq_jax.kernels.cache_layout import PackedLayout, describe_packed
from kvq_jax.kernels.reference import decode_attention_reference  # Re-export.

__all__ = ["decode_attention", "decode_attention_dense",
           "decode_attention_dense_supported", "decode_attention_reference",
           "decode_attention_supported"]

DEFAULT_BLOCK_K = 128
_MAX_AUTO_SPLITS = 16
PLATFORMS = fp.PLATFORMS


def _target(interpret: bool, platform: str | None) -> str:
  """"interpret", "cuda" or "tpu" (module docstring)."""
  return fp.target(interpret, platform, "decode_attention")


def _check_target(target: str, layouts, head_dim: int,
                  split_len: int) -> str | None:
  """Why `target` cannot serve these layouts and tiles, or None."""
  if target == "cuda":
    return fp.dot_width_reason(layouts, head_dim)
  if target == "tpu" and split_len % fp.TPU_SUBLANES:
    return (f"the split length S/k_splits={split_len} is not a multiple of "
            f"the TPU's {fp.TPU_SUBLANES} sublanes; use fewer splits or a "
            "larger cache.")
  return None


def _resolve_tiling(num_slots: int, block_k: int,
                    k_splits: int | None) -> tuple[int, int] | str:
  """Returns (block_k, k_splits) actually used, or why S does not tile."""
  if not isinstance(block_k, int) or not fp.is_pow2(block_k):
    return (f"block_k={block_k!r}: must be a positive power of two "
            "(Triton block shapes are powers of two).")
  block_k = min(block_k, num_slots)
  if num_slots % block_k:
    return (f"cache slots S={num_slots} is not a multiple of block_k="
            f"{block_k}; allocate the cache with a capacity that is.")
  n_blocks = num_slots // block_k
  if k_splits is None:
    k_splits = min(_MAX_AUTO_SPLITS, n_blocks)
    while n_blocks % k_splits:
      k_splits -= 1
  if not isinstance(k_splits, int) or k_splits < 1 or n_blocks % k_splits:
    return (f"k_splits={k_splits!r}: must be a positive divisor of the "
            f"{n_blocks} blocks of block_k={block_k} in S={num_slots}.")
  return block_k, k_splits


def _check_token_groups(layout: PackedLayout, name: str, block_k: int,
                        split_len: int) -> str | None:
  if layout.scale_axis != -2:
    return None
  gt = layout.token_group
  if block_k % gt and gt % block_k:
    return (f"block_k={block_k} must be a multiple (or divisor) of {name}'s "
            f"per-channel token group {gt}.")
  if split_len % gt and gt % split_len:
    return (f"the split length S/k_splits={split_len} must be a multiple (or "
            f"divisor) of {name}'s per-channel token group {gt}.")
  return None


def _check_common(q, length, num_kv: int, batch: int, head_dim: int,
                  start=None) -> str | None:
  if q.ndim != 4:
    return (f"q has shape {tuple(q.shape)}; expected [B, K, G, H] (one query "
            "token per sequence, query heads grouped by KV head).")
  if tuple(q.shape[:2]) != (batch, num_kv) or q.shape[3] != head_dim:
    return (f"q has shape {tuple(q.shape)}; expected [B={batch}, K={num_kv}, "
            f"G, H={head_dim}] to match the cache.")
  if tuple(jnp.shape(length)) != (batch,):
    return (f"length_B has shape {tuple(jnp.shape(length))}; expected "
            f"[B={batch}].")
  if start is not None and tuple(jnp.shape(start)) != (batch,):
    return (f"start_B has shape {tuple(jnp.shape(start))}; expected "
            f"[B={batch}].")
  return None


def decode_attention_supported(q_BxKxGxH, k, v, length_B, *,
                               start_B=None,
                               block_k: int = DEFAULT_BLOCK_K,
                               k_splits: int | None = None,
                               platform: str | None = None,
                               interpret: bool = False) -> str | None:
  """Why `decode_attention` cannot run on these inputs (on `platform`, see
  the module docstring), or None if it can."""
  reason = fp.platform_reason(platform)
  if reason:
    return reason
  head_dim = q_BxKxGxH.shape[-1]
  if not hasattr(k, "data") or not hasattr(v, "data"):
    return ("k and v must be kvq_jax.quant.QuantizedArray; use "
            "decode_attention_dense for plain arrays.")
  if k.data.ndim != 4:
    return (f"k.data has shape {tuple(k.data.shape)}; expected the "
            "heads-major cache [B, K, S, H*bits/8].")
  batch, num_kv, num_slots = k.data.shape[:3]
  reason = _check_common(q_BxKxGxH, length_B, num_kv, batch, head_dim,
                         start_B)
  if reason:
    return reason
  layouts = [describe_packed(x, head_dim, n, num_slots)
             for x, n in ((k, "k"), (v, "v"))]
  for layout in layouts:
    if isinstance(layout, str):
      return layout
  if tuple(v.data.shape[:3]) != (batch, num_kv, num_slots):
    return (f"v.data has shape {tuple(v.data.shape)}; K and V must share "
            f"[B, K, S] = {(batch, num_kv, num_slots)}.")
  tiling = _resolve_tiling(num_slots, block_k, k_splits)
  if isinstance(tiling, str):
    return tiling
  bk, ns = tiling
  for layout, n in zip(layouts, ("k", "v")):
    reason = _check_token_groups(layout, n, bk, num_slots // ns)
    if reason:
      return reason
  return _check_target(_target(interpret, platform), layouts, head_dim,
                       num_slots // ns)


def decode_attention_dense_supported(q_BxKxGxH, k_BxKxSxH, v_BxKxSxH,
                                     length_B, *, start_B=None,
                                     block_k: int = DEFAULT_BLOCK_K,
                                     k_splits: int | None = None,
                                     platform: str | None = None,
                                     interpret: bool = False) -> str | None:
  """Why `decode_attention_dense` cannot run on these inputs, or None."""
  reason = fp.platform_reason(platform)
  if reason:
    return reason
  if hasattr(k_BxKxSxH, "data") or hasattr(v_BxKxSxH, "data"):
    return ("k and v must be plain [B, K, S, H] arrays; use decode_attention "
            "for QuantizedArray caches.")
  if k_BxKxSxH.ndim != 4:
    return (f"k has shape {tuple(k_BxKxSxH.shape)}; expected the heads-major "
            "cache [B, K, S, H].")
  batch, num_kv, num_slots, head_dim = k_BxKxSxH.shape
  reason = _check_common(q_BxKxGxH, length_B, num_kv, batch, head_dim,
                         start_B)
  if reason:
    return reason
  if tuple(v_BxKxSxH.shape) != tuple(k_BxKxSxH.shape):
    return (f"v has shape {tuple(v_BxKxSxH.shape)}, k "
            f"{tuple(k_BxKxSxH.shape)}; they must match.")
  tiling = _resolve_tiling(num_slots, block_k, k_splits)
  if isinstance(tiling, str):
    return tiling
  return _check_target(_target(interpret, platform), (None, None), head_dim,
                       num_slots // tiling[1])


# ----------------------------------------------------------------------------
# Kernel.
# ----------------------------------------------------------------------------


def _decode_kernel(start_ref, length_ref, q_ref, *refs, k_layout, v_layout,
                   block_k: int, split_len: int, head_dim: int,
                   scalar_prefetch: bool):
  nk, nv = fp.n_refs(k_layout), fp.n_refs(v_layout)
  k_refs, v_refs = refs[:nk], refs[nk:nk + nv]
  o_ref, m_ref, l_ref = refs[nk + nv:]
  gp = q_ref.shape[1]

  split_start = pl.program_id(2) * split_len
  if scalar_prefetch:  # [B] in SMEM (TPU)
    b = pl.program_id(0)
    begin, length = start_ref[b], length_ref[b]
  else:  # this sequence's own [] block
    begin, length = start_ref[()], length_ref[()]
  # Valid slots of this split, relative to it: [lo, hi).
  lo = jnp.clip(begin - split_start, 0, split_len)
  hi = jnp.clip(length - split_start, 0, split_len)
  first_block = lo // block_k
  end_block = jnp.where(hi > lo, (hi + block_k - 1) // block_k, first_block)
  qs = [q_ref[j, :, :].astype(jnp.float32)
        for j in range(fp.parts(k_layout))]

  def body(i, carry):
    start = pl.multiple_of(i * block_k, block_k)
    return fp.attend_block(
        qs, k_refs, v_refs, carry, k_layout=k_layout, v_layout=v_layout,
        start=start, block_k=block_k, split_start=split_start,
        first_token=split_start + start, begin=begin, end=length,
        head_dim=head_dim)

  carry = jax.lax.fori_loop(first_block, end_block, body,
                            fp.init_carry(gp, head_dim, fp.parts(v_layout)))
  fp.store_carry(o_ref, m_ref, l_ref, carry)


def _cache_specs(x, layout: PackedLayout | None, split_len: int,
                 spec) -> tuple[list[Any], list[Any]]:
  """(arrays, block specs) of one cache tensor for the (B, K, split) grid;
  `spec(block_shape, index_map(b, h, s))` makes a BlockSpec."""
  if layout is None:
    return [x], [spec((None, None, split_len, x.shape[-1]),
                      lambda b, h, s: (b, h, s, 0))]
  scales = [x.scale] + ([] if layout.symmetric else [x.zero])
  specs = [spec((None, None, split_len, x.data.shape[-1]),
                lambda b, h, s: (b, h, s, 0))]
  if layout.scale_axis == -1:
    scale_spec = spec((None, None, split_len, layout.n_groups),
                      lambda b, h, s: (b, h, s, 0))
  else:
    gt, parts = layout.token_group, layout.parts
    scales = [fp.scale_planes(a, parts) for a in scales]
    rows = max(1, split_len // gt)
    if split_len >= gt:
      index = lambda b, h, s: (b, h, s, 0, 0)
    else:  # Several splits share one token group (row).
      index = lambda b, h, s: (b, h, (s * split_len) // gt, 0, 0)
    scale_spec = spec((None, None, rows, parts, x.scale.shape[-1] // parts),
                      index)
  return [x.data] + scales, specs + [scale_spec] * len(scales)


def _run(q_BxKxGxH, k, v, length_B, start_B, k_layout, v_layout, *,
         block_k: int, k_splits: int, interpret: bool, platform: str | None,
         return_lse: bool):
  batch, num_kv, g, head_dim = q_BxKxGxH.shape
  num_slots = (k.data if k_layout is not None else k).shape[2]
  split_len = num_slots // k_splits
  k_parts, v_parts = fp.parts(k_layout), fp.parts(v_layout)
  target = _target(interpret, platform)
  gp = fp.padded_heads(g, target)
  tpu = target == "tpu"

  def spec(block_shape, index_map):
    if tpu:  # Index maps also receive the scalar-prefetch refs.
      return pl.BlockSpec(block_shape, lambda b, h, s, *_: index_map(b, h, s))
    return pl.BlockSpec(block_shape, index_map)

  q_planes = fp.query_planes(q_BxKxGxH, gp, k_parts)

  k_arrays, k_specs = _cache_specs(k, k_layout, split_len, spec)
  v_arrays, v_specs = _cache_specs(v, v_layout, split_len, spec)
  kernel = functools.partial(
      _decode_kernel, k_layout=k_layout, v_layout=v_layout, block_k=block_k,
      split_len=split_len, head_dim=head_dim, scalar_prefetch=tpu)
  out_shape, out_specs = fp.split_outputs(
      batch, num_kv, k_splits, v_parts, gp, head_dim, spec)
  in_specs = [fp.query_spec(k_parts, gp, head_dim, spec)]
  in_specs += k_specs + v_specs
  grid = (batch, num_kv, k_splits)
  if tpu:  # lengths and starts by scalar prefetch (SMEM)
    grid_kw = dict(grid_spec=pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=grid, in_specs=in_specs,
        out_specs=out_specs))
  else:
    row = pl.BlockSpec((None,), lambda b, h, s: (b,))
    grid_kw = dict(grid=grid, in_specs=[row, row] + in_specs,
                   out_specs=out_specs)
  o, m, l = pl.pallas_call(
      kernel,
      out_shape=out_shape,
      interpret=interpret,
      compiler_params=fp.compiler_params(target),
      name="kvq_decode_attention",
      **grid_kw,
  )(start_B.astype(jnp.int32), length_B.astype(jnp.int32), q_planes,
    *k_arrays, *v_arrays)

  return fp.merge_splits(o, m, l, g, head_dim, return_lse)


@functools.partial(jax.jit, static_argnames=("block_k", "k_splits",
                                             "interpret", "platform",
                                             "return_lse"))
def decode_attention(q_BxKxGxH: jax.Array, k, v, length_B: jax.Array, *,
                     start_B: jax.Array | None = None,
                     block_k: int = DEFAULT_BLOCK_K,
                     k_splits: int | None = None, interpret: bool = False,
                     platform: str | None = None, return_lse: bool = False):
  """Attention of one query token per sequence over a packed KV cache.

  Args:
    q_BxKxGxH: queries (post-RoPE), G query heads per KV head.
    k: keys, a QuantizedArray over [B, K, S, H] (see `cache_layout`).
    v: values, same [B, K, S]; its format and granularity may differ from k.
    length_B: int [B]; slots >= length_b are masked.
    start_B: int [B] or None (zeros); slots < start_b are masked.
    block_k: slots per inner block (power of two; clipped to S).
    k_splits: sequence splits (grid axis), merged by log-sum-exp; None picks
      the largest count <= 16 dividing S / block_k.
    interpret: run the Pallas interpreter (required on CPU).
    platform: None (the default backend), "cuda" or "tpu": what to lower
      for (module docstring); cross-lowering from a CPU host names it.
    return_lse: also return the natural-log log-sum-exp [B, K, G] of the
      scaled scores (-inf for empty sequences).

  Returns:
    out [B, K, G, H] float32 (zeros where start_b >= length_b), and lse if
    asked.

  Raises:
    ValueError: unsupported format/granularity or shapes that do not tile
      (see `decode_attention_supported`).
  """
  reason = decode_attention_supported(q_BxKxGxH, k, v, length_B,
                                      start_B=start_B, block_k=block_k,
                                      k_splits=k_splits, platform=platform,
                                      interpret=interpret)
  if reason:
    raise ValueError(f"decode_attention: {reason}")
  head_dim = q_BxKxGxH.shape[-1]
  num_slots = k.data.shape[2]
  k_layout = describe_packed(k, head_dim, "k", num_slots)
  v_layout = describe_packed(v, head_dim, "v", num_slots)
  bk, ns = _resolve_tiling(num_slots, block_k, k_splits)
  start_B = jnp.zeros_like(length_B) if start_B is None else start_B
  return _run(q_BxKxGxH, k, v, length_B, start_B, k_layout, v_layout,
              block_k=bk, k_splits=ns, interpret=interpret,
              platform=platform, return_lse=return_lse)


@functools.partial(jax.jit, static_argnames=("block_k", "k_splits",
                                             "interpret", "platform",
                                             "return_lse"))
def decode_attention_dense(q_BxKxGxH: jax.Array, k_BxKxSxH: jax.Array,
                           v_BxKxSxH: jax.Array, length_B: jax.Array, *,
                           start_B: jax.Array | None = None,
                           block_k: int = DEFAULT_BLOCK_K,
                           k_splits: int | None = None,
                           interpret: bool = False,
                           platform: str | None = None,
                           return_lse: bool = False):
  """`decode_attention` over a plain (bf16/f32) heads-major cache."""
  reason = decode_attention_dense_supported(
      q_BxKxGxH, k_BxKxSxH, v_BxKxSxH, length_B, start_B=start_B,
      block_k=block_k, k_splits=k_splits, platform=platform,
      interpret=interpret)
  if reason:
    raise ValueError(f"decode_attention_dense: {reason}")
  bk, ns = _resolve_tiling(k_BxKxSxH.shape[2], block_k, k_splits)
  start_B = jnp.zeros_like(length_B) if start_B is None else start_B
  return _run(q_BxKxGxH, k_BxKxSxH, v_BxKxSxH, length_B, start_B, None, None,
              block_k=bk, k_splits=ns, interpret=interpret,
              platform=platform, return_lse=return_lse)
