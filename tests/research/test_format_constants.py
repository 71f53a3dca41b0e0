"""The allocator's constants against a hand count and `capacity.memory`."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.capacity.memory import effective_bytes
from kvq_jax.research import allocator, format_constants
from kvq_jax.settings.short_specs import parse_short_spec
from tests.models.tiny import TINY

CONTEXT = 64
ELEMENTS = CONTEXT * TINY.num_kv_heads * TINY.head_dim  # One tensor.


def _spec() -> CacheSpec:
  """Range-mode key affines (2 kv heads x 16) with 2-bit levels per layer."""
  rng = np.random.default_rng(0)
  affines = tuple(KeyAffine.from_arrays(
      rng.normal(0, 1, (2, 16)), np.exp(rng.normal(0, 1, (2, 16))),
      mode="range", codebooks={2: (-1.5 - i, -0.5, 0.5, 1.5)})
      for i in range(TINY.num_layers))
  return CacheSpec(k=parse_short_spec("int2_st"),
                   v=parse_short_spec("int4_g8"), key_rope="pre",
                   key_affines=affines)


def test_hand_count():
  """int2_st keys: 4 float32 levels + shift and scale (2 x 2 x 16 float32)
  = 272 bytes per layer; int2_lm and int2_vq hold only a fixed table (0
  per layer); int4_g8 nothing."""
  bits = format_constants.constant_bits(
      _spec(), TINY, CONTEXT, ["int2_st", "int2_lm"], ["int2_vq", "int4_g8"])
  for layer in range(TINY.num_layers):
    assert bits[("K", layer, "int2_st")] == 8 * 272 / ELEMENTS
    assert bits[("V", layer, "int2_vq")] == 0.0
    assert bits[("V", layer, "int4_g8")] == 0.0
  # The Lloyd-Max int2 keys still pay the affine (the cache normalises them).
  assert bits[("K", 0, "int2_lm")] == 8 * 256 / ELEMENTS
  tables = format_constants.fixed_table_bits(
      TINY, CONTEXT, ["int2_lm", "int2_vq", "int2_g8_vq", "int4_g8"])
  assert set(tables) == {"int2_lm", "int2_vq", "int2_g8_vq"}
  assert tables["int2_vq"][1] == 8 * 4096 / (2 * TINY.num_layers * ELEMENTS)
  assert tables["int2_vq"][0] == tables["int2_g8_vq"][0]
  assert tables["int2_lm"][0] != tables["int2_vq"][0]


@pytest.mark.parametrize("k, v", [("int2_st", "int4_g8"),
                                  ("int2_st", "int2_vq"),
                                  ("int2_lm", "int2_vq")])
def test_allocator_cost_equals_capacity_memory(k, v):
  """A one-format assignment costs, in the allocator, exactly the effective
  bits `capacity.memory` charges the same cache (up to the 1/1024 grid)."""
  spec = dataclasses.replace(_spec(), k=parse_short_spec(k),
                             v=parse_short_spec(v))
  constants = format_constants.constant_bits(spec, TINY, CONTEXT, [k], [v])
  tables = format_constants.fixed_table_bits(TINY, CONTEXT, [k, v])
  damage = {(t, i, f): 0.0 for t, f in (("K", k), ("V", v))
            for i in range(TINY.num_layers)}
  slots = allocator.FullPrecisionSlots(context=CONTEXT, window_bits=16)
  a = allocator.allocate(damage, TINY.num_layers, [k], [v], 32.0,
                         head_dim=TINY.head_dim, fp_bits=32, slots=slots,
                         constant_bits=constants, fixed_tables=tables)
  memory = 8 * effective_bytes(TINY, spec, jnp.float32, CONTEXT) / (
      2 * TINY.num_layers * ELEMENTS)
  assert a.mean_bits == pytest.approx(memory, abs=1 / 1024)
  assert a.mean_bits >= memory - 1e-9

