"""Key statistics -> KeyAffine: hand cases, orbax round trip, end to end."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.calibration.key_runner import calibrate_keys
from kvq_jax.calibration.key_stats import (KeyStatsOptions, key_affines,
                                           layer_affine, weighted_lloyd,
                                           weighted_principal_axes)
from kvq_jax.calibration.recording import LayerRecord
from kvq_jax.persist.key_stats_store import load_key_stats, save_key_stats
from kvq_jax.settings.experiment_settings import settings_from_config

from kvq_jax.quant import QuantSpec
from tests.fixtures import tiny_hf_model


def _record(k_pre, q):
  zeros = np.zeros_like(k_pre)
  return LayerRecord(q_BxTxNxH=q, k_pre_BxTxKxH=k_pre, k_post_BxTxKxH=zeros,
                     v_BxTxKxH=zeros)


def test_hand_computed_shift_and_scale():
  """K = 1 head, H = 4, rotary 4 (pairs (0, 2), (1, 3)); two tokens."""
  k = np.array([[[[1.0, 0.0, 10.0, 5.0]], [[3.0, 0.0, 30.0, 5.0]]]])
  # std per channel: [1, 0 (-> eps), 10, 0 (-> eps)], mean [2, 0, 20, 5].
  q = np.array([[[[1.0, 2.0, 3.0, 4.0]], [[1.0, 2.0, 3.0, 4.0]]]])
  # q energies [1, 4, 9, 16] -> pair means [5, 10, 5, 10].
  eps = 1e-6
  for alpha, beta in ((0.5, 0.0), (1.0, 0.5)):
    affine = layer_affine(_record(k, q), rotary_dim=4,
                          options=KeyStatsOptions(alpha=alpha, beta=beta))
    shift, scale = affine.arrays()
    np.testing.assert_allclose(shift, [[2, 0, 20, 5]])
    raw = (np.array([1, eps, 10, eps]) ** alpha
           / np.sqrt([5, 10, 5, 10]) ** beta)
    raw = raw / np.exp(np.mean(np.log(raw)))
    np.testing.assert_allclose(scale, [raw], rtol=1e-5)
  no_shift = layer_affine(_record(k, q), 4, KeyStatsOptions(shift=False))
  np.testing.assert_array_equal(no_shift.arrays()[0], np.zeros((1, 4)))


def test_range_mode_hand_case():
  """Range mode: mu = (lo + hi) / 2 and s = (hi - lo) / 2 per channel, lo
  and hi the (1 - p, p) quantiles (linear interpolation); a constant
  channel gets s = 1e-6."""
  k = np.zeros((1, 5, 1, 4))
  k[0, :, 0, 0] = [-1.0, 0.0, 1.0, 2.0, 7.0]
  k[0, :, 0, 1] = 3.0
  k[0, :, 0, 2] = [0.0, 1.0, 2.0, 3.0, 4.0]
  k[0, :, 0, 3] = [-4.0, -3.0, -2.0, -1.0, 0.0]
  q = np.ones((1, 5, 1, 4))
  affine = layer_affine(_record(k, q), 4, KeyStatsOptions(mode="range"))
  assert affine.mode == "range"
  shift, scale = affine.arrays()
  np.testing.assert_allclose(shift, [[3.0, 3.0, 2.0, -2.0]], rtol=1e-6)
  np.testing.assert_allclose(scale, [[4.0, 1e-6, 2.0, 2.0]], rtol=1e-6)
  # p = 0.75: channel 0's quantiles are 0.0 and 2.0 (ranks 1 and 3 of 0..4).
  affine = layer_affine(_record(k, q), 4, KeyStatsOptions(
      mode="range", range_quantile=0.75))
  np.testing.assert_allclose(affine.arrays()[0][0, 0], 1.0)
  np.testing.assert_allclose(affine.arrays()[1][0, 0], 1.0)
  with pytest.raises(ValueError, match="range_quantile"):
    KeyStatsOptions(mode="range", range_quantile=0.4)
  with pytest.raises(ValueError, match="mode"):
    KeyStatsOptions(mode="minmax")


def test_weighted_principal_axes_hand_cases():
  """Keys along (1, 1)/sqrt(2) with spread 10 and (1, -1)/sqrt(2) with
  spread 1 (equal query weights): the first axis is +-(1, 1)/sqrt(2). With
  isotropic keys, the axis the queries read most (channel 0, weight 100
  against 1) comes first."""
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((2, 4000))
  keys = np.stack([10 * a + b, 10 * a - b], -1)[:, None] / np.sqrt(2)
  r = weighted_principal_axes(keys - keys.mean(0), np.ones((1, 2)))
  np.testing.assert_allclose(np.abs(r[0, 0]), [2 ** -0.5] * 2, atol=1e-3)
  np.testing.assert_allclose(r[0] @ r[0].T, np.eye(2), atol=1e-12)
  iso = rng.standard_normal((4000, 1, 2))
  r = weighted_principal_axes(iso, np.array([[100.0, 1.0]]))
  np.testing.assert_allclose(np.abs(r[0, 0]), [1.0, 0.0], atol=1e-2)


@pytest.mark.parametrize("mode", ["range", "std"])
def test_rotated_statistics_live_in_rotated_coordinates(mode):
  """With rotation='pca' the affine carries R, and its normalised
  calibration keys are R (k - shift) / s: in range mode (p = 1) exactly
  [-1, 1] per rotated channel, in std mode centred."""
  rng = np.random.default_rng(1)
  mix = rng.standard_normal((4, 4))
  k = (rng.standard_normal((1, 300, 1, 4)) @ mix + [1.0, -2.0, 3.0, 0.5])
  q = rng.standard_normal((1, 300, 2, 4))
  affine = layer_affine(_record(k, q), 4, KeyStatsOptions(
      mode=mode, rotation="pca"))
  rot = affine.rotation_array()
  assert rot.shape == (1, 4, 4)
  np.testing.assert_allclose(rot[0] @ rot[0].T, np.eye(4), atol=1e-5)
  z = np.asarray(affine.normalize(np.swapaxes(k, 1, 2)))[0, 0]
  if mode == "range":
    np.testing.assert_allclose(z.max(0), 1.0, atol=1e-4)
    np.testing.assert_allclose(z.min(0), -1.0, atol=1e-4)
  else:
    np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-4)
  no_shift = layer_affine(_record(k, q), 4, KeyStatsOptions(
      rotation="pca", shift=False))
  np.testing.assert_allclose(no_shift.arrays()[0], 0.0, atol=1e-5)
  with pytest.raises(ValueError, match="rotation"):
    KeyStatsOptions(rotation="random")


def test_weighted_lloyd_hand_cases():
  x = np.array([0.0, 0.0, 1.0, 1.0, 10.0, 10.0])
  np.testing.assert_allclose(weighted_lloyd(x, np.ones(6), 2), [0.5, 10.0],
                             atol=1e-5)
  # One level: the weighted mean; weights move it.
  np.testing.assert_allclose(
      weighted_lloyd(np.array([0.0, 1.0]), np.array([3.0, 1.0]), 1), [0.25])
  # Gaussian samples, 4 levels: Max's (1960) N(0, 1) optimum +-0.4528,
  # +-1.510.
  z = np.random.default_rng(0).normal(size=200_000)
  np.testing.assert_allclose(weighted_lloyd(z, np.ones_like(z), 4),
                             [-1.510, -0.4528, 0.4528, 1.510], atol=0.02)


def test_range_mode_codebooks_exclude_outliers_and_reach_the_cache(tmp_path):
  rng = np.random.default_rng(2)
  k = rng.normal(size=(1, 300, 2, 8))
  k[0, ::10, 0, 3] = 40.0  # One huge value in every tenth vector.
  q = np.ones((1, 300, 2, 8))
  plain = layer_affine(_record(k, q), 8, KeyStatsOptions(
      mode="range", codebook_bits=(2,)))
  kept = layer_affine(_record(k, q), 8, KeyStatsOptions(
      mode="range", codebook_bits=(2, 3), outliers=1))
  assert len(kept.levels(3)) == 8 and kept.levels(4) == ()
  # Without the outliers the fit spends no level on them.
  assert max(plain.levels(2)) > 2 * max(kept.levels(2))
  save_key_stats(tmp_path / "ks", [kept, kept], {})
  loaded = load_key_stats(tmp_path / "ks")
  assert loaded == (kept, kept)
  st3 = QuantSpec("int3", "static", "per_token", outliers=1)
  spec = CacheSpec(k=st3, v=None, key_rope="pre", key_affines=loaded)
  assert spec.layer(1).k.levels == kept.levels(3)
  assert spec.layer(1).k.outliers == 1
  # No codebook for the bit width: uniform levels.
  st4 = dataclasses.replace(st3, format="int4")
  assert CacheSpec(k=st4, v=None, key_rope="pre",
                   key_affines=loaded).layer(0).k.levels == ()


def test_grouped_queries_and_partial_rotary():
  rng = np.random.default_rng(0)
  k = rng.normal(size=(2, 50, 2, 8))
  q = rng.normal(size=(2, 50, 4, 8)) * np.arange(1, 9)
  affine = layer_affine(_record(k, q), rotary_dim=4,
                        options=KeyStatsOptions(alpha=0.0, beta=2.0))
  scale = affine.arrays()[1]
  assert affine.shape == (2, 8)
  # beta=2, alpha=0: s = 1/qrms^2; pairs (0, 2), (1, 3) share it, channels
  # 4..7 (not rotated) keep their own.
  np.testing.assert_allclose(scale[:, 0], scale[:, 2], rtol=1e-6)
  np.testing.assert_allclose(scale[:, 1], scale[:, 3], rtol=1e-6)
  assert np.all(np.diff(scale[:, 4:], axis=1) < 0)
  with pytest.raises(ValueError, match="rotary_dim"):
    layer_affine(_record(k, q), rotary_dim=5)


def test_store_round_trip(tmp_path):
  rng = np.random.default_rng(1)
  records = [_record(rng.normal(size=(1, 20, 2, 8)),
                     rng.normal(size=(1, 20, 4, 8))) for _ in range(3)]
  affines = key_affines(records, 8)
  save_key_stats(tmp_path / "ks", affines, {"model": "synthetic"})
  assert load_key_stats(tmp_path / "ks") == affines
  ranges = key_affines(records, 8, KeyStatsOptions(mode="range"))
  save_key_stats(tmp_path / "kr", ranges, {"model": "synthetic"})
  assert load_key_stats(tmp_path / "kr") == ranges
  assert ranges[0].mode == "range" and ranges != affines
  rotated = key_affines(records, 8, KeyStatsOptions(mode="range",
                                                    rotation="pca"))
  save_key_stats(tmp_path / "kp", rotated, {"model": "synthetic"})
  assert load_key_stats(tmp_path / "kp") == rotated
  assert rotated[0].rotation_array().shape == (2, 8, 8)
  with pytest.raises(ValueError, match="rotation"):
    save_key_stats(tmp_path / "mixed", ranges[:1] + rotated[1:], {})
  with pytest.raises(ValueError, match="calibrate_keys"):
    load_key_stats(tmp_path / "missing")


def test_calibrate_keys_end_to_end_on_a_tiny_model(tmp_path):
  config, text = tiny_hf_model.calibration_preset(tmp_path, "tq4")
  summary = calibrate_keys(config, str(tmp_path / "ks"), eval_data=text,
                           num_calib_windows=2)
  assert summary["evaluation_tokens"][1] <= summary["calibration_tokens"][0]
  config.cache.key_stats = str(tmp_path / "ks")
  spec = settings_from_config(config).cache_spec
  assert len(spec.key_affines) == tiny_hf_model.L
  assert spec.layer(1).key_affine.shape == (tiny_hf_model.K,
                                            tiny_hf_model.H)
