"""The cross-layer prediction chain on data with a known answer, and its
constants counted by hand."""

from __future__ import annotations

import numpy as np
import pytest

from kvq_jax.research import prediction_chain


def _uniform_quantizer(step):
  return lambda x: step * np.round(np.asarray(x) / step)


def _layers(num_layers, n, k, h, coupling, seed=0):
  """Layer l = coupling * rotated layer l-1 + fresh noise; values = keys
  mixed by a fixed matrix plus their own noise."""
  rng = np.random.default_rng(seed)
  mix = rng.normal(size=(k * h, k * h)) / np.sqrt(k * h)
  out, prev = [], rng.normal(size=(n, k * h))
  for _ in range(num_layers):
    keys = coupling * prev @ np.linalg.qr(rng.normal(size=(k * h,) * 2))[0]
    keys += np.sqrt(1 - coupling ** 2) * rng.normal(size=(n, k * h))
    vals = 0.9 * keys @ mix + 0.3 * rng.normal(size=(n, k * h))
    out.append((keys.reshape(n, k, h), vals.reshape(n, k, h)))
    prev = keys
  return out


def test_params_and_cost_by_hand():
  # SmolLM2's shape: 3 kv heads of 64. full: K 3 * (192 * 64 + 64) =
  # 37056; V 3 * (384 * 64 + 64) = 73920; V-from-K 37056.
  full = prediction_chain.predictor_params("full", 3, 64)
  assert full == {"k": 37056, "v": 73920, "v_from_k": 37056}
  head = prediction_chain.predictor_params("head", 3, 64)
  assert head == {"k": 3 * (64 * 64 + 64), "v": 3 * (128 * 64 + 64),
                  "v_from_k": 3 * (64 * 64 + 64)}
  # 110976 bf16 numbers over 512 tokens x 384 elements: 9.03 bits each.
  assert prediction_chain.constant_bits(110976, 512, 3, 64) == pytest.approx(
      110976 * 16 / (512 * 384))
  assert prediction_chain.constant_bits(110976, 4096, 3, 64) == pytest.approx(
      1.12890625)
  with pytest.raises(ValueError, match="allowed"):
    prediction_chain.predictor_params("diagonal", 3, 64)


def test_standardized_coding_by_hand():
  # Channel 0: mean 10, sd 2; channel 1: constant 3 (sd kept at 1).
  x = np.array([[8.0, 3.0], [12.0, 3.0], [8.0, 3.0], [12.0, 3.0]])
  # Q rounds to the nearest integer in standardized units: z = -1, +1
  # exactly and 0 for the constant channel, so the code is exact.
  got = prediction_chain.standardized(np.round, x, n_train=4)
  np.testing.assert_allclose(got, x)
  # A Q that halves: mu + sd * z / 2 = 9, 11.
  got = prediction_chain.standardized(lambda z: z / 2, x, n_train=4)
  np.testing.assert_allclose(got[:, 0], [9.0, 11.0, 9.0, 11.0])
  np.testing.assert_allclose(got[:, 1], 3.0)


def test_predictable_layers_gain_and_independent_ones_do_not():
  q = _uniform_quantizer(0.05)
  coupled = prediction_chain.chain_gain(_layers(4, 4000, 2, 4, 0.95), q)
  assert coupled[0]["k_chain_bits"] == 0.0  # Layer 0 is coded directly.
  for row in coupled[1:]:
    # Standardized coding: the error scales with the coded signal's
    # deviation, so the residual's variance 1 - 0.95^2 = 0.0975 of the
    # key's gains 0.5 log2(1 / 0.0975) = 1.68 bits.
    assert 1.5 < row["k_chain_bits"] < 1.9
    # Values: 0.9 K M + 0.3 noise; the residual is the noise (0.09 of
    # about 0.9): about 1.66 bits, from the chain and from own keys.
    assert row["v_chain_bits"] > 1.3
    assert row["v_from_k_bits"] > 1.3
  independent = prediction_chain.chain_gain(_layers(4, 4000, 2, 4, 0.0), q)
  for row in independent[1:]:
    assert abs(row["k_chain_bits"]) < 0.05


def test_net_bits_charge_every_layer_but_the_first():
  rows = [{"k_chain_bits": 0.0, "v_chain_bits": 0.0, "v_from_k_bits": 0.4},
          {"k_chain_bits": 1.0, "v_chain_bits": 0.6, "v_from_k_bits": 0.4}]
  params = {"k": 100, "v": 200, "v_from_k": 100}
  got = prediction_chain.net_bits(rows, params, context=10, num_kv_heads=1,
                                  head_dim=5)
  # Gains per element: (0 + 0.8) / 2 = 0.4; cost 300 * 16 / (10 * 10) = 48
  # bits on one of the two layers: 24.
  assert got["chain_gain"] == pytest.approx(0.4)
  assert got["chain_cost"] == pytest.approx(24.0)
  assert got["chain_net"] == pytest.approx(-23.6)
  assert got["v_from_k_gain"] == pytest.approx(0.2)
  assert got["v_from_k_cost"] == pytest.approx(16.0)


def test_rejects_a_split_without_held_out_rows():
  with pytest.raises(ValueError, match="both sides"):
    prediction_chain.chain_gain(_layers(2, 10, 1, 2, 0.5),
                                _uniform_quantizer(0.1), train_frac=1.0)
