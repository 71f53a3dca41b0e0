"""jit, vmap and pytree behaviour of QuantizedArray."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.quant import QuantizedArray, QuantSpec, dequantize, quantize

X = jax.random.normal(jax.random.key(0), (3, 8, 2, 16), jnp.bfloat16)


@pytest.mark.parametrize("spec", [
    QuantSpec(format="int4", granularity="per_token"),
    QuantSpec(format="int2", scheme="asymmetric", granularity="per_group", group_size=8),
    QuantSpec(format="int8", scheme="asymmetric", granularity="per_channel", group_size=4),
    QuantSpec(format="fp8_e4m3", granularity="per_group", group_size=8),
    QuantSpec(format="int5", scheme="symmetric_narrow", granularity="per_group",
              group_size=8),
    QuantSpec(format="int5", granularity="per_group", group_size=8,
              scale_dtype="float16", rounding="ggml"),
], ids=lambda s: f"{s.format}-{s.scheme}-{s.granularity}-{s.rounding}")
def test_vmap_matches_batched_call(spec):
  batched = quantize(X, spec)
  mapped = jax.vmap(lambda x: quantize(x, spec))(X)
  assert mapped.shape == batched.shape == X.shape
  for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(mapped)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(jax.vmap(dequantize)(mapped), dequantize(batched))


def test_jit_of_a_user_function_and_dtype_override():
  spec = QuantSpec(format="int4", scheme="asymmetric", group_size=8)

  @jax.jit
  def roundtrip(x):
    return dequantize(quantize(x, spec), jnp.float32)

  out = roundtrip(X)
  assert out.dtype == jnp.float32
  np.testing.assert_array_equal(out, dequantize(quantize(X, spec), jnp.float32))
  assert dequantize(quantize(X, spec)).dtype == jnp.bfloat16


def test_pytree_flatten_unflatten_keeps_spec_static():
  spec = QuantSpec(format="int4", scheme="asymmetric", group_size=8)
  qa = quantize(X, spec)
  leaves, treedef = jax.tree.flatten(qa)
  assert len(leaves) == 3 and all(isinstance(l, jax.Array) for l in leaves)
  assert leaves[0].dtype == jnp.uint8
  assert not any(isinstance(l, QuantSpec) for l in leaves)
  rebuilt = jax.tree.unflatten(treedef, leaves)
  assert isinstance(rebuilt, QuantizedArray)
  assert (rebuilt.spec, rebuilt.last_dim, rebuilt.dtype) == (spec, 16, "bfloat16")
  # Different specs give different treedefs (so jit recompiles per spec).
  other = quantize(X, QuantSpec(format="int4", scheme="asymmetric", group_size=4))
  assert jax.tree.structure(other) != treedef
  sym = quantize(X, QuantSpec(format="int4", group_size=8))
  assert len(jax.tree.leaves(sym)) == 2 and sym.zero is None


def test_quantized_array_passes_through_jit_and_tree_map():
  qa = quantize(X, QuantSpec(format="int8", granularity="per_token"))
  out = jax.jit(lambda q: jax.tree.map(lambda a: a, q))(qa)
  assert out.spec == qa.spec and out.shape == qa.shape
  sliced = jax.tree.map(lambda a: a[1:], qa)
  assert sliced.shape == (2, 8, 2, 16)
  np.testing.assert_array_equal(dequantize(sliced), dequantize(qa)[1:])
