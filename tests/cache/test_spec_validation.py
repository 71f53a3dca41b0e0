"""CacheSpec / QuantizedLayerCache.create reject invalid configurations."""

from __future__ import annotations

import pytest

from kvq_jax.cache.quantized import QuantizedLayerCache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.quant import QuantSpec

INT4_G8 = QuantSpec("int4", "symmetric", "per_group", 8)
PC8 = QuantSpec("int2", "asymmetric", "per_channel", 8)
PC12 = QuantSpec("int2", "asymmetric", "per_channel", 12)


@pytest.mark.parametrize("kwargs,match", [
    (dict(k=PC8, v=INT4_G8, flush_block=12), "flush_block=12"),
    (dict(k=PC8, v=INT4_G8, flush_block=0), "flush_block=0"),
    (dict(k=PC8, v=PC12, flush_block=12), r"flush_block=12.*\(24\)"),
    (dict(k=PC8, v=INT4_G8, sink=4), "sink=4"),
    (dict(k=PC8, v=INT4_G8, block_size=20), "block_size=20"),
    (dict(k=QuantSpec("int8", "symmetric", "per_tensor"), v=None),
     "per_tensor"),
    (dict(k=None, v=QuantSpec("int8", "symmetric", "per_tensor")),
     r"CacheSpec\.v\.granularity='per_tensor'"),
    (dict(k=INT4_G8, v=INT4_G8, residual=-1), "residual=-1"),
    (dict(k=INT4_G8, v=INT4_G8, sink=-2), "sink=-2"),
    (dict(k=INT4_G8, v=INT4_G8, key_rope="mid"), "key_rope='mid'"),
    (dict(k=INT4_G8, v=INT4_G8, block_size=0), "block_size=0"),
    (dict(k=INT4_G8, v=INT4_G8,
          layer_overrides=((1, None, None), (1, INT4_G8, None))),
     "names a layer twice"),
    (dict(k=INT4_G8, v=INT4_G8, layer_overrides=((-1, None, None),)),
     "layer_overrides entry"),
    (dict(k=INT4_G8, v=INT4_G8, layer_overrides=((0, None),)),
     "layer_overrides entry"),
    (dict(k=QuantSpec("int4", "symmetric", "per_channel"), v=None),
     "needs a token group_size"),
    (dict(k=QuantSpec("int4", "symmetric", "per_group", 8, axis=-2), v=None),
     r"CacheSpec\.k\.axis=-2"),
    (dict(k=INT4_G8, v=INT4_G8,
          layer_overrides=((0, QuantSpec("int8", "symmetric", "per_tensor"),
                            None),)), r"layer_overrides\[0\]\.k"),
])
def test_cache_spec_rejects(kwargs, match):
  with pytest.raises(ValueError, match=match):
    CacheSpec(**kwargs)


def test_flush_block_is_chosen_per_tensor():
  # Default: a per-channel tensor waits for its token group, a token-local
  # one is committed as written (no full-precision window for it).
  layer = CacheSpec(k=PC8, v=INT4_G8).layer(0)
  assert (layer.flush_k, layer.flush_v) == (8, 1)
  assert (layer.window_of("k"), layer.window_of("v")) == (7, 0)
  layer = CacheSpec(k=INT4_G8, v=PC8, residual=4).layer(0)
  assert (layer.flush_k, layer.flush_v) == (1, 8)
  assert layer.full_precision_slots == {"k": 4, "v": 11}
  # An explicit flush_block applies to both tensors.
  layer = CacheSpec(k=PC8, v=INT4_G8, flush_block=16).layer(0)
  assert (layer.flush_k, layer.flush_v) == (16, 16)
  layer = CacheSpec(k=INT4_G8, v=INT4_G8).layer(0)
  assert (layer.flush_k, layer.flush_v, layer.window) == (1, 1, 0)


def test_layer_override_beyond_the_model_is_refused():
  spec = CacheSpec(k=INT4_G8, v=INT4_G8, layer_overrides=((30, None, None),))
  spec.check_num_layers(31)
  with pytest.raises(ValueError, match="layer 30.*has 30 layers"):
    spec.check_num_layers(30)


@pytest.mark.parametrize("head_dim", [12, 24])
def test_hadamard_needs_power_of_two_head_dim_at_create(head_dim):
  spec = CacheSpec(k=QuantSpec("int8", "symmetric", "per_token"), v=None,
                   hadamard_k=True).layer(0)
  with pytest.raises(ValueError, match=f"power of two; got {head_dim}"):
    QuantizedLayerCache.create(spec, 1, 16, 1, head_dim)


def test_create_rejects_bad_capacity():
  spec = CacheSpec(k=INT4_G8, v=INT4_G8).layer(0)
  with pytest.raises(ValueError, match="capacity=0"):
    QuantizedLayerCache.create(spec, 1, 0, 1, 16)
