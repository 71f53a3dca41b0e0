"""The dependence diagnostics on data with a known answer, then end to end on
the tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvq_jax.research import dependence
from kvq_jax.research.dependence_runner import (DependenceOptions,
                                                key_metric, round_trip,
                                                run_dependence, value_metric)
from tests.fixtures import tiny_hf_model


def _exact_covariance(cov_DxD, n=4000, seed=0):
  """Rows whose sample covariance (1/n, centred) is exactly cov."""
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(n, len(cov_DxD)))
  z -= z.mean(axis=0)
  q, _ = np.linalg.qr(z)  # Orthonormal, zero-mean columns.
  w, u = np.linalg.eigh(cov_DxD)
  return np.sqrt(n) * q @ np.diag(np.sqrt(w)) @ u.T


def test_water_fill_by_hand():
  var = [4.0, 1.0, 0.25, 0.0625]
  # 2 bits each on average: every component is above the water level
  # theta = GM * 2^-4 = 0.5 / 16.
  assert dependence.water_fill(var, 2.0) == pytest.approx(0.03125)
  # 0.5 bits on average = 2 bits in all: theta = 0.5 gives 1.5 + 0.5 bits
  # to the first two, none to the others.
  assert dependence.water_fill(var, 0.5) == pytest.approx(
      (0.5 + 0.5 + 0.25 + 0.0625) / 4)


def test_transform_gain_of_a_rotated_gaussian():
  # Eigenvalues 4 and 1/4 at 45 degrees: both channels have variance
  # 2.125, so unequal bits per channel buy nothing and the PCA basis buys
  # AM/GM = 2.125 (3.27 dB), at 2 bits (both components above the water).
  c, s = np.cos(np.pi / 4), np.sin(np.pi / 4)
  u = np.array([[c, -s], [s, c]])
  x = _exact_covariance(u @ np.diag([4.0, 0.25]) @ u.T)
  got = dependence.transform_gain(x, 2.0)
  assert got["native_alloc_db"] == pytest.approx(0.0, abs=1e-9)
  assert got["pca_db"] == pytest.approx(10 * np.log10(2.125), abs=1e-6)
  assert got["pca_bits"] == pytest.approx(
      np.log2(2.125) / 2, abs=1e-6)
  # A metric that is a multiple of the identity changes nothing.
  scaled = dependence.transform_gain(x, 2.0, 3.0 * np.eye(2))
  assert scaled["pca_db"] == pytest.approx(got["pca_db"], abs=1e-9)
  # A metric weighting channel 0 by 4: the weighted eigenvalues of
  # diag(2,1) C diag(2,1) against the weighted native variances.
  m = np.diag([4.0, 1.0])
  w = dependence.transform_gain(x, 2.0, m)
  root = np.diag([2.0, 1.0])
  eig = np.linalg.eigvalsh(root @ (u @ np.diag([4.0, 0.25]) @ u.T) @ root)
  want = np.mean([4 * 2.125, 2.125]) / np.sqrt(np.prod(eig))
  assert w["pca_db"] == pytest.approx(10 * np.log10(want), abs=1e-6)


def test_ridge_bits_find_a_linear_map_and_nothing_in_noise():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2000, 6))
  y = x @ rng.normal(size=(6, 3)) + 0.01 * rng.normal(size=(2000, 3))
  assert dependence.ridge_bits(x, y, lam=1e-6)["bits"] > 5
  noise = dependence.ridge_bits(x, rng.normal(size=(2000, 3)))
  assert abs(noise["bits"]) < 0.02
  with pytest.raises(ValueError, match="both sides"):
    dependence.ridge_bits(x, y, train_frac=1.0)


def test_vq_gains_a_bit_on_perfectly_correlated_channels():
  # x1 = x2 uniform on [-1, 1] at 1 bit per coordinate: two scalar levels
  # per channel (MSE 1/12) against four cells along the diagonal (1/48):
  # 6.02 dB, one bit.
  t = np.random.default_rng(2).uniform(-1, 1, size=8000)
  got = dependence.vq_vs_scalar(np.stack([t, t], axis=1), 2, 1)
  assert got["scalar_mse"] == pytest.approx(1 / 12, rel=0.05)
  assert got["vq_mse"] == pytest.approx(1 / 48, rel=0.05)
  assert got["gain_bits"] == pytest.approx(1.0, abs=0.05)
  with pytest.raises(ValueError, match="groups of 4"):
    dependence.vq_vs_scalar(np.zeros((10, 6)), 4, 1)


def test_metrics_by_hand():
  q = np.zeros((1, 2, 4))
  q[0, 0] = [1.0, 2.0, 3.0, 4.0]  # Two query heads, head_dim 4.
  q[0, 1] = [1.0, 0.0, 1.0, 0.0]
  # E[q^2] = [1, 2, 5, 8]; RoPE pairs (0, 2), (1, 3) averaged: 3, 5.
  np.testing.assert_allclose(np.diag(key_metric(q, 4)), [3, 5, 3, 5])
  w = np.arange(16.0).reshape(8, 2)  # 2 heads of head_dim 4, hidden 2.
  want = w[4:8] @ w[4:8].T
  np.testing.assert_allclose(value_metric(w, range(1, 2), 4), want)


def test_round_trip_inputs_cost_the_ridge_what_they_lose():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(2000, 64))
  assert round_trip(x, None) is x
  # int8 g32: the step is range / 255, so the error is ~0.3% of the range.
  err8 = np.abs(round_trip(x, 8) - x).max()
  assert 0 < err8 < 0.01 * (x.max() - x.min())
  # An exact linear target: exact inputs predict it (many bits), int4 inputs
  # about 4 bits' worth (relative MSE ~ the input's quantization noise),
  # int2 inputs less again.
  y = x @ rng.normal(size=(64, 8))
  exact = dependence.ridge_bits(x, y, lam=1e-9)["bits"]
  b4 = dependence.ridge_bits(round_trip(x, 4), y, lam=1e-9)["bits"]
  b2 = dependence.ridge_bits(round_trip(x, 2), y, lam=1e-9)["bits"]
  assert exact > 10 > b4 and 3 < b4 < 5 and 1 < b2 < b4 - 1.5


def test_bad_options():
  with pytest.raises(ValueError, match="ridge_input_bits"):
    DependenceOptions(ridge_input_bits=(7,))
  with pytest.raises(ValueError, match="at most 2\\^8"):
    DependenceOptions(vq_grid=((4, 4),))
  with pytest.raises(ValueError, match="rate"):
    DependenceOptions(rate=0)


def test_end_to_end_on_the_tiny_model(tmp_path):
  config, text = tiny_hf_model.calibration_preset(tmp_path, "int4_g32")
  options = DependenceOptions(num_calib_windows=2, vq_grid=((2, 1),),
                              vq_layer_stride=1)
  out = run_dependence(config, str(tmp_path / "dep"), eval_data=text,
                       options=options)
  assert out["evaluation_tokens"][1] <= out["calibration_tokens"][0]
  rows = out["rows"]
  assert len(rows) == tiny_hf_model.L * tiny_hf_model.K
  assert "k_ridge" not in rows[0] and "v_ridge" in rows[-1]
  for key in ("k_ridge_int4", "k_ridge_int2", "v_ridge_int4", "v_ridge_int2"):
    # (The tiny random model has nothing to predict, so no ordering holds
    # here; the ordering is tested on a known linear map above.)
    assert np.isfinite(rows[-1][key]["bits"])
  for row in rows:
    for key in ("k_plain", "k_weighted", "v_plain"):
      # Diagonal metrics: the PCA basis is the optimal orthogonal transform
      # (Gaussian theory), so it never loses to unequal bits per channel,
      # which never loses to equal bits.
      assert row[key]["pca_db"] >= row[key]["native_alloc_db"] - 1e-6
      assert row[key]["native_alloc_db"] >= -1e-6
    assert np.isfinite(row["v_weighted"]["pca_db"])
    assert np.isfinite(row["k_vq_d2_r1"]["gain_db"])
  saved = json.loads((tmp_path / "dep" / "dependence.json").read_text())
  assert saved["rows"] == json.loads(json.dumps(rows))
  md = (tmp_path / "dep" / "dependence.md").read_text()
  assert "| **all** |" in md and "K VQ d2 r1 bits" in md
  assert "V ridge bits (int2 inputs)" in md
  # The prediction chain: both quantizers, both predictor shapes where the
  # model has several kv heads, every layer, net of the constants.
  want = {f"int{b}_{s}" for b in (4, 2) for s in ("full", "head")
          if s == "full" or tiny_hf_model.K > 1}
  assert set(out["chain"]) == want
  for entry in out["chain"].values():
    assert len(entry["rows"]) == tiny_hf_model.L
    assert [n["context"] for n in entry["net"]] == [512, 4096]
    for n in entry["net"]:
      assert n["chain_cost"] > 0 and np.isfinite(n["chain_net"])
  assert "## The prediction chain through the quantizer" in md
