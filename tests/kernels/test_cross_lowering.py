"""The decode kernel lowers for CUDA (Triton) and TPU (Mosaic) from a CPU host.

`jax.jit(...).trace(...).lower(lowering_platforms=(p,))` runs the Pallas
lowering for platform p without a device: block-shape rules, scalar
prefetch, compiler parameters and the kernel body's lowering all run, so a
kernel that would not compile there fails here (only the platform's own
backend compiler, Triton or Mosaic's, is not run). Every listed format, B =
2, head_dim 64, 128 and 256, and GQA with G = 3 query heads per kv head.
The paged kernel likewise, over pools as the paged cache stores them
(bf16 scales as uint16 bits), head_dim 64 and 128: for TPU its scalar-
prefetched block table picks each page's block, for CUDA the kernel reads
pages of the whole pool through the table (strided token-group scales).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from kvq_jax.cache.paged.store import pool_store
from kvq_jax.kernels.decode_attention import (decode_attention,
                                              decode_attention_dense,
                                              decode_attention_supported)
from kvq_jax.kernels.paged_decode_attention import paged_decode_attention
from kvq_jax.quant import QuantSpec, quantize

B, K, G, S = 2, 2, 3, 256
# (name, key spec, value spec): int8 per token, int4 per group, int2
# asymmetric, KIVI-style per-channel keys.
FORMATS = {
    "int8_per_token": (QuantSpec("int8", "symmetric", "per_token"),) * 2,
    "int4_g32": (QuantSpec("int4", "symmetric", "per_group", 32),) * 2,
    "int2_g32_asym": (QuantSpec("int2", "asymmetric", "per_group", 32),) * 2,
    "per_channel_keys": (
        QuantSpec("int4", "asymmetric", "per_channel", 32, axis=-2,
                  scale_dtype="float32"),
        QuantSpec("int4", "asymmetric", "per_group", 32)),
}
# What each platform's lowered module calls the kernel.
MARKER = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}


def _lower(fn, platform, *args, **kwargs) -> str:
  """The lowered module's text; for TPU, Mosaic asks the device kind (its
  generation picks tiling rules), the one thing faked here: an abstract
  mesh with a TPU v5e device."""
  trace = lambda: fn.trace(*args, platform=platform, **kwargs).lower(
      lowering_platforms=(platform,)).as_text()
  if platform != "tpu":
    return trace()
  device = jax.sharding.AbstractDevice(device_kind="TPU v5 lite",
                                       num_cores=1, platform="tpu")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    return trace()


def _inputs(head_dim, k_spec, v_spec):
  q = jax.ShapeDtypeStruct((B, K, G, head_dim), jnp.float32)
  kv = jnp.zeros((B, K, S, head_dim), jnp.float32)
  k = jax.eval_shape(lambda x: quantize(x, k_spec), kv)
  v = jax.eval_shape(lambda x: quantize(x, v_spec), kv)
  return q, k, v, jax.ShapeDtypeStruct((B,), jnp.int32)


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("name", list(FORMATS))
def test_decode_kernel_lowers(platform, head_dim, name):
  q, k, v, length = _inputs(head_dim, *FORMATS[name])
  text = _lower(decode_attention, platform, q, k, v, length,
                start_B=length, block_k=64)
  assert MARKER[platform] in text


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", list(FORMATS))
def test_paged_kernel_lowers(platform, head_dim, name):
  num_pages, page, max_pages = 64, 32, 8  # 2 splits of 4 pages.
  pages = jnp.zeros((num_pages, K, page, head_dim), jnp.float32)
  k, v = (jax.eval_shape(lambda x, s=s: pool_store(quantize(x, s), s), pages)
          for s in FORMATS[name])
  q = jax.ShapeDtypeStruct((B, K, G, head_dim), jnp.float32)
  table = jax.ShapeDtypeStruct((B, max_pages), jnp.int32)
  end = jax.ShapeDtypeStruct((B,), jnp.int32)
  text = _lower(paged_decode_attention, platform, q, k, v, table, end,
                start_B=end, page_size=page, pages_per_block=4)
  assert MARKER[platform] in text


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_dense_kernel_lowers(platform):
  q = jax.ShapeDtypeStruct((B, K, G, 64), jnp.float32)
  kv = jax.ShapeDtypeStruct((B, K, S, 64), jnp.bfloat16)
  length = jax.ShapeDtypeStruct((B,), jnp.int32)
  assert MARKER[platform] in _lower(decode_attention_dense, platform, q, kv,
                                    kv, length, block_k=64)


def test_unservable_shapes_say_why_per_platform():
  """int2 at head_dim 32 gives 8-wide dots (Triton needs 16); a 4-slot
  split is below the TPU's 8 sublanes. Both are fine for the other."""
  spec = QuantSpec("int2", "asymmetric", "per_group", 32)
  q, k, v, _ = _inputs(32, spec, spec)
  length = jnp.zeros((B,), jnp.int32)
  q = jnp.zeros(q.shape)
  assert "tl.dot" in decode_attention_supported(q, k, v, length,
                                                platform="cuda")
  assert decode_attention_supported(q, k, v, length, platform="tpu") is None
  assert "sublanes" in decode_attention_supported(
      q, k, v, length, block_k=4, k_splits=64, platform="tpu")
  assert decode_attention_supported(q, k, v, length, platform="rocm")
