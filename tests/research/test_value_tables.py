"""Fitted value tables (`research.value_tables`): hand cases, the cache's
own encoding, data with a known answer, then end to end on the tiny
model."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache import hadamard
from kvq_jax.quant import QuantSpec, dequantize, quantize, vector_codebook
from kvq_jax.research import value_tables as vt
from kvq_jax.research.value_tables_runner import (VARIANTS, ValueTableOptions,
                                                  layer_rows,
                                                  run_value_tables)
from tests.fixtures import tiny_hf_model

SHARED2 = vector_codebook.centroids(2).astype(np.float64)


def test_encode_scaled_is_the_caches_vector_code():
  """Same codewords and least-squares scale as scheme 'vector' with a
  float32 scale (so no rounding of the scale separates the two)."""
  x = np.random.default_rng(0).standard_normal((32, 64)) * 3.0
  spec = QuantSpec("int2", "vector", "per_token", scale_dtype="float32")
  want = np.asarray(dequantize(quantize(jnp.asarray(x, jnp.float32), spec)))
  got = vt.encode_scaled(x.astype(np.float32), SHARED2)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_weighted_lloyd_step_by_hand():
  points = np.array([[0.0], [1.0], [10.0], [30.0]])
  start = np.array([[0.5], [10.0], [100.0]])
  # Cells {0, 1} -> weighted mean (0*1 + 1*3) / 4; {10, 30} -> (10*1 +
  # 30*1) / 2 = 20; the empty third cell keeps its codeword.
  got = vt.fit_table(points, start, np.array([1.0, 3.0, 1.0, 1.0]), iters=1)
  np.testing.assert_allclose(got, [[0.75], [20.0], [100.0]])
  with pytest.raises(ValueError, match="one non-negative weight"):
    vt.fit_table(points, start, np.array([1.0, -1.0, 1.0, 1.0]))


def test_shared_table_is_nearly_a_fixed_point_on_gaussian_groups():
  """On normalised Gaussian rows the shipped table is the k-means answer:
  refitting it buys (held out) less than 0.02 bit either way."""
  rng = np.random.default_rng(1)
  train, test = rng.standard_normal((4096, 64)), rng.standard_normal((1024, 64))
  y, _ = vt.normalised(train)
  fitted = vt.fit_table(y.reshape(-1, 4), SHARED2, iters=10)
  base = vt.distortion(test, vt.encode_scaled(test, SHARED2))["plain"]
  new = vt.distortion(test, vt.encode_scaled(test, fitted))["plain"]
  assert abs(vt.gain_bits(base, new)) < 0.02


def test_a_fitted_table_finds_correlated_groups():
  """Groups whose 4 coordinates are one value repeated live on a line:
  a table fitted to them beats the Gaussian one by over a bit, scaled or
  not, and the metric weighting of identical groups changes nothing."""
  rng = np.random.default_rng(2)
  z = rng.standard_normal((3000, 16))
  x = np.repeat(z, 4, axis=1)
  train, test = x[:2000], x[2000:]
  y, rho2 = vt.normalised(train)
  scaled = vt.fit_table(y.reshape(-1, 4), SHARED2,
                        vt.group_weights(2000, 64, 4, rho2), iters=15)
  raw = train.reshape(-1, 4)
  unscaled = vt.fit_table(raw, SHARED2 * np.sqrt(np.mean(raw ** 2)),
                          iters=15)
  base = vt.distortion(test, vt.encode_scaled(test, SHARED2))["plain"]
  for enc, table in ((vt.encode_scaled, scaled), (vt.encode_unscaled,
                                                  unscaled)):
    cost = vt.distortion(test, enc(test, table))["plain"]
    assert vt.gain_bits(base, cost) > 1.0


def test_metrics_by_hand():
  d = 8
  h = hadamard.hadamard_matrix_np(d)
  signs = hadamard.sign_vector(d, (0, 3))
  # An orthogonal change of coordinates keeps the identity metric.
  np.testing.assert_allclose(vt.rotated_metric(np.eye(d), signs, h),
                             np.eye(d), atol=1e-6)
  # ... and the cost: e M e^T of the native error equals the rotated one's.
  rng = np.random.default_rng(3)
  a = rng.standard_normal((d, d))
  m = a @ a.T
  x, r = rng.standard_normal((5, d)), rng.standard_normal((5, d))
  rot = lambda v: (v * signs) @ h
  native = vt.distortion(x, r, m)["weighted"]
  rotated = vt.distortion(rot(x), rot(r), vt.rotated_metric(m, signs, h))
  np.testing.assert_allclose(rotated["weighted"], native, rtol=1e-5)
  np.testing.assert_allclose(rotated["plain"],
                             vt.distortion(x, r)["plain"], rtol=1e-5)
  # Group weights: the mean diagonal per group (2 and 4), normalised to
  # mean 1.
  np.testing.assert_allclose(
      vt.metric_group_weights(np.diag([1.0, 3.0, 4.0, 4.0]), 2),
      [2 / 3, 4 / 3])
  np.testing.assert_allclose(vt.group_weights(2, 4, 2, [1.0, 2.0],
                                              [0.5, 1.5]),
                             [0.5, 1.5, 1.0, 3.0])
  assert vt.gain_bits(4.0, 1.0) == pytest.approx(1.0)


def test_table_bits_by_hand():
  # SmolLM2 at 512 tokens: 90 tables of 256 x 4 bfloat16 = 1 474 560 bits
  # over 512 x 30 x 3 x 64 = 2 949 120 value elements.
  assert vt.table_bits(90, 256, 4, 512, 30, 3, 64) == pytest.approx(0.5)
  assert vt.table_bits(30, 256, 4, 4096, 30, 3, 64) == pytest.approx(
      30 * 256 * 4 * 16 / (4096 * 30 * 3 * 64))
  with pytest.raises(ValueError, match="context"):
    vt.table_bits(1, 256, 4, 0, 1, 1, 64)


def test_bad_options():
  with pytest.raises(ValueError, match="bits=3"):
    ValueTableOptions(bits=3)
  with pytest.raises(ValueError, match="train_frac"):
    ValueTableOptions(train_frac=1.0)
  with pytest.raises(ValueError, match="contexts"):
    ValueTableOptions(contexts=(0,))


def test_layer_rows_on_correlated_values():
  """Values whose rotated coordinates (the layer's own Hadamard signs)
  repeat in groups of 4: every fitted variant beats the shared table by
  over a bit, in the plain MSE and in the metric (the identity here, so
  the two agree)."""
  rng = np.random.default_rng(4)
  d, layer = 64, 1
  x_rot = np.repeat(rng.standard_normal((1200, 2, d // 4)), 4, axis=2)
  h = hadamard.hadamard_matrix_np(d).astype(np.float64)
  v = (x_rot @ h) * hadamard.sign_vector(d, (0, layer))  # unrotate.
  rows = layer_rows(v, np.stack([np.eye(d)] * 2), layer=layer,
                    options=ValueTableOptions(iters=6))
  assert [r["kv_head"] for r in rows] == [0, 1]
  for row in rows:
    for name in VARIANTS:
      assert row[name]["gain_bits_plain"] > 1.0, (name, row[name])
      assert row[name]["gain_bits_weighted"] == pytest.approx(
          row[name]["gain_bits_plain"], rel=1e-6)


def test_end_to_end_on_the_tiny_model(tmp_path):
  config, text = tiny_hf_model.calibration_preset(tmp_path, "int4_g32")
  options = ValueTableOptions(num_calib_windows=2, iters=3)
  out = run_value_tables(config, str(tmp_path / "vt"), eval_data=text,
                         options=options)
  assert out["evaluation_tokens"][1] <= out["calibration_tokens"][0]
  assert len(out["rows"]) == tiny_hf_model.L * tiny_hf_model.K
  summ = {s["variant"]: s for s in out["summary"]}
  assert set(summ) == set(VARIANTS)
  for s in summ.values():
    assert np.isfinite(s["gain_bits_weighted"])
    charges = [p["charge"] for p in s["contexts"]]
    assert charges[0] == pytest.approx(8 * charges[1])  # 512 vs 4096.
  assert summ["layer_weighted"]["tables"] == tiny_hf_model.L
  assert summ["head_unscaled"]["scale_bits_saved"] > 0
  saved = json.loads((tmp_path / "vt" / "value_tables.json").read_text())
  assert saved["rows"] == json.loads(json.dumps(out["rows"]))
  md = (tmp_path / "vt" / "value_tables.md").read_text()
  assert "| head_weighted |" in md and "charge / net @4096" in md
