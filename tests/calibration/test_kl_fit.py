"""KL-objective fit of static-key ranges (`kvq_jax.calibration.kl_fit`)."""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest

from kvq_jax.cache.key_affine import KeyAffine
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.calibration.key_runner import calibrate_keys
from kvq_jax.calibration.key_stats import KeyStatsOptions, key_affines
from kvq_jax.calibration.kl_fit import (KLFit, KLFitOptions, base_log_probs,
                                        check_fittable, fit_params,
                                        fitted_affines, initial_params,
                                        scored_kl)
from kvq_jax.calibration.kl_fit_runner import fit_keys
from kvq_jax.calibration.recording import record_qkv
from kvq_jax.facade import LoadedModel, window_forward
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.persist.key_stats_store import load_key_stats, save_key_stats
from kvq_jax.quant import QuantSpec
from tests.fixtures import tiny_hf_model
from tests.models.tiny import TINY

T = 24
FIRST = T // 2  # second-half scoring
INT3_ST = QuantSpec("int3", "static", "per_token", outliers=1)
INT4_ST = QuantSpec("int4", "static", "per_token")
INT4_G8 = QuantSpec("int4", "asymmetric", "per_group", 8)


@functools.lru_cache(maxsize=None)
def model() -> LoadedModel:
  decoder = decoder_from_params(TINY, random_params(TINY, seed=5, scale=0.3))
  return LoadedModel(decoder=decoder, tokenizer=None, source="tiny")


def tokens(batch, seed):
  return np.random.default_rng(seed).integers(
      0, TINY.vocab_size, (batch, T)).astype(np.int32)


@functools.lru_cache(maxsize=None)
def calibrated() -> tuple[KeyAffine, ...]:
  records = record_qkv(model(), tokens(2, 1))
  return key_affines(records, TINY.rotary_dim,
                     KeyStatsOptions(mode="range"))


def spec(affines, sink=1, k=INT3_ST) -> CacheSpec:
  return CacheSpec(k=k, v=INT4_G8, key_rope="pre", sink=sink,
                   hadamard_v=True, rotation_seed=1, key_affines=affines)


@functools.lru_cache(maxsize=None)
def kl_fit(affines, sink=1, k=INT3_ST) -> KLFit:
  """Cached: tests sharing a cache spec share its compiled programs."""
  s = spec(affines, sink, k)
  return KLFit(model().decoder, [s.layer(i) for i in range(TINY.num_layers)],
               FIRST)


def test_fit_cache_is_the_real_cache_at_any_theta():
  """theta = 0 is the preset's cache; theta != 0 is the cache built from
  the fitted (written) affines: the artefact reproduces what was fit
  (one sink token: both paths of the write)."""
  sink = 1
  ids = tokens(2, 0)
  fit = kl_fit(calibrated(), sink)
  zero = np.zeros((TINY.num_layers, TINY.num_kv_heads, TINY.head_dim))
  want = window_forward(model(), spec(calibrated(), sink), "float32")(ids)
  np.testing.assert_allclose(fit.logits(zero, ids), want, atol=1e-4, rtol=0)
  theta = np.random.default_rng(0).uniform(-0.7, 0.7, zero.shape)
  moved = spec(fitted_affines(calibrated(), theta), sink)
  want = np.asarray(window_forward(model(), moved, "float32")(ids))
  np.testing.assert_allclose(fit.logits(theta, ids), want, atol=1e-4, rtol=0)
  assert np.abs(want - np.asarray(fit.logits(zero, ids))).max() > 1e-3


def moved_params(seed, fit=("range", "codebook", "rotation")):
  """Parameters away from the start: theta, sorted jittered levels and a
  rotation of a few degrees per head."""
  rng = np.random.default_rng(seed)
  layers = [spec(calibrated()).layer(i) for i in range(TINY.num_layers)]
  params = initial_params(TINY, KLFitOptions(granularity="channel",
                                             fit=fit), layers)
  params["theta"] = rng.uniform(-0.4, 0.4, params["theta"].shape)
  if "levels" in params:
    params["levels"] = tuple(np.sort(np.asarray(c) + rng.normal(
        0, 0.05, c.shape)) for c in params["levels"])
  if "skew" in params:
    params["skew"] = rng.normal(0, 0.1, params["skew"].shape)
  return layers, params


def test_fit_cache_is_the_real_cache_with_fitted_codebooks_and_rotations():
  """The start (uniform levels, A = 0) is the preset's cache; random
  levels, rotations and ratios are the cache built from the affines they
  write (codebooks and R stored in the stats)."""
  ids = tokens(2, 6)
  fit = kl_fit(calibrated())
  layers, params = moved_params(0)
  start = initial_params(TINY, KLFitOptions(fit=("codebook", "rotation")),
                         layers)
  want = window_forward(model(), spec(calibrated()), "float32")(ids)
  np.testing.assert_allclose(fit.logits(start, ids), want, atol=1e-4, rtol=0)
  rotations = np.stack([np.asarray(r) for r in fit.rotations(
      fit._params(params))])
  written = fitted_affines(calibrated(), params["theta"], layers,
                           params["levels"], rotations)
  for a, c, r in zip(written, params["levels"], rotations):
    np.testing.assert_array_equal(a.levels(INT3_ST.bits),
                                  np.asarray(c, np.float32))
    np.testing.assert_array_equal(a.rotation_array(), r)
  want = np.asarray(window_forward(model(), spec(written), "float32")(ids))
  np.testing.assert_allclose(fit.logits(params, ids), want, atol=1e-4,
                             rtol=0)
  assert np.abs(want - np.asarray(fit.logits(start, ids))).max() > 1e-3


def test_codebook_and_rotation_gradients_are_nonzero_everywhere():
  ids = tokens(1, 7)
  base = base_log_probs(window_forward(model(), None, "float32")(ids), FIRST)
  _, params = moved_params(1)
  _, grad = kl_fit(calibrated()).value_and_grad(params, ids, base)
  for layer in range(TINY.num_layers):
    assert np.abs(np.asarray(grad["levels"][layer])).max() > 0
    assert np.abs(np.asarray(grad["skew"][layer])).max() > 0


def test_codebook_and_rotation_fit_lowers_the_kl_and_round_trips(tmp_path):
  """Ranges left alone (theta stays 0), codebooks and rotations learned:
  the KL on the fit's windows drops and the stats save and load."""
  ids = tokens(2, 8)
  base = base_log_probs(window_forward(model(), None, "float32")(ids), FIRST)
  fit = kl_fit(calibrated())
  result = fit_params(fit, ids, base, KLFitOptions(
      steps=4, learning_rate=0.02, fit=("codebook", "rotation")))
  assert result.kept and result.kl_after < result.kl_before
  assert not result.theta_LxKxH.any()
  gram = np.einsum("lkab,lkcb->lkac", result.rotation_LxKxHxH,
                   result.rotation_LxKxHxH)
  # Orthogonal to float32 rounding: the exponential's squarings leave a
  # few ulp per product (1.14e-5 on one diagonal element on an AMD EPYC
  # host); a turn that were not a rotation (A not skew) would be off by
  # about the step, 0.02.
  np.testing.assert_allclose(gram, np.broadcast_to(
      np.eye(TINY.head_dim), gram.shape), atol=5e-5)
  assert all(np.all(np.diff(c) > 0) for c in result.levels)
  layers = [spec(calibrated()).layer(i) for i in range(TINY.num_layers)]
  written = fitted_affines(calibrated(), result.theta_LxKxH, layers,
                           result.levels, result.rotation_LxKxHxH)
  save_key_stats(tmp_path, written, {"test": True})
  assert load_key_stats(tmp_path) == written


def test_scored_kl_hand_case():
  """Two vocab entries; base (0.5, 0.5) against model (0.8, 0.2) at the one
  scored prediction: KL = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2)."""
  logits = jnp.asarray([[[9.0, 9.0], [np.log(0.8), np.log(0.2)],
                         [3.0, 1.0]]])
  base = np.log(np.asarray([[[0.5, 0.5]]]))
  want = 0.5 * np.log(0.5 / 0.8) + 0.5 * np.log(0.5 / 0.2)
  np.testing.assert_allclose(float(scored_kl(logits, base, 1)), want,
                             rtol=1e-6)


def test_gradient_reaches_every_layer_through_the_rounding():
  ids = tokens(1, 2)
  fit = kl_fit(calibrated())
  base = base_log_probs(window_forward(model(), None, "float32")(ids), FIRST)
  value, grad = fit.value_and_grad(
      jnp.zeros((TINY.num_layers, TINY.num_kv_heads, TINY.head_dim)), ids,
      base)
  grad = np.asarray(grad["theta"])
  assert float(value) > 0 and np.all(np.isfinite(grad))
  for layer in range(TINY.num_layers):
    assert np.abs(grad[layer]).max() > 0


@pytest.mark.parametrize("granularity", ["channel", "layer"])
def test_fit_repairs_ranges_that_clip_too_hard(granularity):
  """Ranges shrunk to a quarter clip most keys (int4 static keys); the fit
  widens them and lowers the KL on its windows (kept); a layer fit moves
  whole layers."""
  squeezed = tuple(KeyAffine.from_arrays(a.arrays()[0], 0.25 * a.arrays()[1],
                                         "range") for a in calibrated())
  ids = tokens(2, 3)
  base = base_log_probs(window_forward(model(), None, "float32")(ids), FIRST)
  result = fit_params(kl_fit(squeezed, k=INT4_ST), ids, base, KLFitOptions(
      steps=24, learning_rate=0.1, granularity=granularity))
  assert result.kept and result.kl_after < 0.6 * result.kl_before
  assert len(result.losses) == 24 and result.theta_LxKxH.mean() > 0.2
  if granularity == "layer":
    for layer in result.theta_LxKxH:
      assert np.ptp(layer) == 0


def test_fit_keeps_the_calibrated_ranges_when_it_cannot_improve():
  """A fit that only makes things worse (a huge learning rate) is dropped:
  theta comes back as zeros."""
  ids = tokens(1, 4)
  base = base_log_probs(window_forward(model(), None, "float32")(ids), FIRST)
  result = fit_params(kl_fit(calibrated()), ids, base, KLFitOptions(
      steps=1, learning_rate=4.0))
  assert not result.kept and result.kl_after >= result.kl_before
  assert not result.theta_LxKxH.any()


def test_fitted_affines_scale_the_ranges_and_round_trip(tmp_path):
  theta = np.random.default_rng(1).normal(
      0, 0.3, (TINY.num_layers, TINY.num_kv_heads, TINY.head_dim))
  fitted = fitted_affines(calibrated(), theta)
  for a, f, t in zip(calibrated(), fitted, theta):
    np.testing.assert_allclose(f.arrays()[1], a.arrays()[1] * np.exp(t),
                               rtol=1e-6)
    np.testing.assert_array_equal(f.arrays()[0], a.arrays()[0])
    assert f.mode == "range"
  save_key_stats(tmp_path, fitted, {"test": True})
  assert load_key_stats(tmp_path) == fitted


@pytest.mark.parametrize("kwargs, match", [
    (dict(k=INT4_G8, v=INT4_G8), "static"),
    (dict(k=INT3_ST, v=INT4_G8, key_rope="pre", residual=8), "residual"),
])
def test_unfittable_caches_raise(kwargs, match):
  if kwargs["k"] is INT3_ST:
    kwargs["key_affines"] = calibrated()
  layer = CacheSpec(**kwargs).layer(0)
  with pytest.raises(ValueError, match=match):
    check_fittable(layer, "test")


@pytest.mark.parametrize("kwargs", [
    dict(steps=0), dict(learning_rate=0.0), dict(granularity="head"),
    dict(fit=()), dict(fit=("range", "scale")), dict(fit=("range", "range"))])
def test_bad_options_raise(kwargs):
  with pytest.raises(ValueError, match="KLFitOptions"):
    KLFitOptions(**kwargs)


def test_std_mode_affines_are_refused():
  std = tuple(dataclasses.replace(a, mode="std") for a in calibrated())
  layer = CacheSpec(k=INT4_G8, v=None, key_rope="pre",
                    key_affines=std).layer(0)
  with pytest.raises(ValueError, match="range-mode"):
    check_fittable(layer, "test")


def test_fit_keys_end_to_end_on_a_tiny_model(tmp_path):
  """calibrate_keys --mode=range, then fit_keys: the written stats load
  into the preset's cache, ranges moved by the fitted per-layer ratios,
  and the sidecar records what the fit saw."""
  config, text = tiny_hf_model.calibration_preset(tmp_path, "kq4")
  calibrate_keys(config, str(tmp_path / "ks"), eval_data=text,
                 num_calib_windows=2,
                 options=KeyStatsOptions(mode="range"))
  config.cache.key_stats = str(tmp_path / "ks")
  logged = []
  summary = fit_keys(config, str(tmp_path / "kl"), eval_data=text,
                     num_calib_windows=2, options=KLFitOptions(
                         steps=2, learning_rate=0.1), log=logged.append)
  assert len(logged) == 2 and summary["steps"] == 2
  assert summary["evaluation_tokens"][1] <= summary["calibration_tokens"][0]
  assert summary["fitted_from"] == str(tmp_path / "ks")
  start, fitted = load_key_stats(tmp_path / "ks"), load_key_stats(
      tmp_path / "kl")
  ratios = [f.arrays()[1] / s.arrays()[1] for s, f in zip(start, fitted)]
  for r in ratios:  # one ratio per layer
    np.testing.assert_allclose(r, r.flat[0], rtol=1e-5)
  assert summary["kept"] == any(abs(r.flat[0] - 1) > 1e-6 for r in ratios)
