"""Clip calibration: fake quant, loss reduction, storage, preset, windows."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base as base_config
from kvq_jax.cache.dense import DenseLayerCache
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.calibration.fake_quant import fake_quant
from kvq_jax.calibration.optimize import CalibrationOptions, learn_layer_clip
from kvq_jax.calibration.preset import clip_layer_overrides, write_preset
from kvq_jax.calibration.recording import LayerRecord, RecordingLayerCache
from kvq_jax.calibration.store import (ClipRatios, load_clip_ratios,
                                       save_clip_ratios)
from kvq_jax.calibration.windows import assert_disjoint, split_windows
from kvq_jax.cli import config_flag
from kvq_jax.models.rope import Rope
from kvq_jax.quant import QuantSpec, dequantize, quantize
from kvq_jax.settings.experiment_settings import settings_from_config

ROPE = Rope(theta=10000.0, rotary_dim=32)


@pytest.mark.parametrize("spec", [
    QuantSpec("int4", "symmetric", "per_group", group_size=16, axis=None),
    QuantSpec("int2", "asymmetric", "per_group", group_size=16),
    QuantSpec("int4", "asymmetric", "per_channel", group_size=8, axis=-2),
    QuantSpec("fp8_e4m3", "symmetric", "per_token"),
])
@pytest.mark.parametrize("clip", [1.0, 0.8])
def test_fake_quant_matches_the_library(spec, clip):
  spec = dataclasses.replace(spec, scale_dtype="float32", clip_ratio=clip)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 16, 32)) * 3.0
  want = dequantize(quantize(x, spec), jnp.float32)
  got = fake_quant(x, spec, jnp.float32(clip))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _outlier_record(seed=0, b=1, t=64, n=2, k=1, h=32):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = jax.random.normal(keys[0], (b, t, n, h))
  kk = jax.random.normal(keys[1], (b, t, k, h))
  v = jax.random.normal(keys[2], (b, t, k, h))
  # Sparse large outliers: one element in 16 is 12x larger.
  rng = np.random.default_rng(seed)
  boost = np.where(rng.random(v.shape) < 1 / 16, 12.0, 1.0)
  kk, v = kk * boost, v * np.roll(boost, 3, axis=-1)
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))
  k_post = ROPE(kk, positions)
  return LayerRecord(*(np.asarray(a, np.float32) for a in (q, kk, k_post, v)))


def test_calibration_reduces_attention_error_with_outliers():
  int2 = QuantSpec("int2", "asymmetric", "per_group", group_size=32)
  layer = CacheSpec(k=int2, v=int2).layer(0)
  clip = learn_layer_clip(_outlier_record(), layer, ROPE,
                          CalibrationOptions(steps=60, learning_rate=0.1,
                                             num_queries=32))
  assert clip.loss < 0.9 * clip.loss_unclipped
  assert clip.k < 1.0 or clip.v < 1.0
  assert 0.5 < min(clip.k, clip.v) and max(clip.k, clip.v) <= 1.0


def test_full_precision_layer_is_left_alone():
  layer = CacheSpec(k=None, v=None).layer(0)
  clip = learn_layer_clip(_outlier_record(), layer, ROPE)
  assert (clip.k, clip.v, clip.loss) == (1.0, 1.0, 0.0)


def test_recording_cache_attends_like_the_dense_cache():
  rec = _outlier_record(seed=1, b=2, t=8)
  q, k_pre, v = (jnp.asarray(a) for a in (rec.q_BxTxNxH, rec.k_pre_BxTxKxH,
                                          rec.v_BxTxKxH))
  positions = jnp.broadcast_to(jnp.arange(8), (2, 8))
  cache = RecordingLayerCache.create(2, 8, 2, 1, 32)
  out, cache = cache.attend(q, k_pre, v, positions, ROPE)
  dense = DenseLayerCache.create(2, 8, 1, 32)
  want, _ = dense.attend(q, k_pre, v, positions, ROPE)
  np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(cache.k_post_BxTxKxH, rec.k_post_BxTxKxH,
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(cache.q_BxTxNxH, q)
  assert cache.length_B.tolist() == [8, 8]


def _ratios():
  return ClipRatios(k_L=[0.875, 1.0, 0.9], v_L=[0.75, 1.0, 0.95],
                    k_specs=("int2_g32_asym", "fp", "int2_g32_asym"),
                    v_specs=("int2_g32_asym", "fp", "int4_g32"),
                    metadata={"calibration_tokens": [100, 200]})


def test_clip_ratios_round_trip_through_orbax(tmp_path):
  save_clip_ratios(tmp_path / "r", _ratios())
  back = load_clip_ratios(tmp_path / "r")
  np.testing.assert_array_equal(back.k_L, _ratios().k_L)
  np.testing.assert_array_equal(back.v_L, _ratios().v_L)
  assert back.k_specs == _ratios().k_specs
  assert back.metadata == {"calibration_tokens": [100, 200]}
  with pytest.raises(ValueError, match="allowed: ratios in"):
    ClipRatios(k_L=[1.5], v_L=[1.0], k_specs=("int4",), v_specs=("int4",))
  with pytest.raises(ValueError, match="experiments.calibrate"):
    load_clip_ratios(tmp_path / "missing")


def test_written_preset_loads_through_settings(tmp_path):
  save_clip_ratios(tmp_path / "clip_ratios", _ratios())
  assert clip_layer_overrides(_ratios()) == (
      "0:int2_g32_asym_clip0.875/int2_g32_asym_clip0.75;1:fp/fp;"
      "2:int2_g32_asym_clip0.9/int4_g32_clip0.95")
  config = config_flag._PresetParser(name="config").parse("int2_g32_asym")  # pylint: disable=protected-access
  config.eval.num_windows = 3
  path = write_preset(tmp_path / "calibrated.py", config, "clip_ratios",
                      "test preset")
  loaded = config_flag._PresetParser(name="config").parse(str(path))  # pylint: disable=protected-access
  settings = settings_from_config(loaded)
  spec = settings.cache_spec
  assert settings.eval.num_windows == 3
  assert spec.layer(0).k.clip_ratio == 0.875
  assert spec.layer(0).v.clip_ratio == 0.75
  assert spec.layer(1).is_full_precision
  assert spec.layer(2).v == QuantSpec("int4", granularity="per_group",
                                      group_size=32, clip_ratio=0.95)
  # Unlisted layers keep the base preset's (unclipped) spec.
  assert spec.layer(3).k.clip_ratio == 1.0
  assert loaded.cache.k.bits == 2 != base_config.get_config().cache.k.bits


def test_calibration_and_evaluation_windows_are_disjoint():
  ids = np.arange(1000)
  split = split_windows(ids, 100, 4, 2)
  assert split.eval_range == (0, 400) and split.calib_range == (800, 1000)
  assert not set(split.eval_WxT.ravel()) & set(split.calib_WxT.ravel())
  assert split.calib_WxT[-1, -1] == 999
  every = split_windows(ids, 100, 0, 3)  # 0: all windows before calibration.
  assert every.eval_WxT.shape == (7, 100)
  assert not set(every.eval_WxT.ravel()) & set(every.calib_WxT.ravel())
  with pytest.raises(ValueError, match="overlap"):
    split_windows(ids, 100, 9, 2)
  with pytest.raises(ValueError, match="overlap"):
    assert_disjoint((0, 10), (5, 20))


def test_split_windows_with_bos_counts_text_tokens():
  split = split_windows(np.arange(100, 130), 4, 2, 3, bos_id=1)
  # 3 text tokens per window; calibration = the last 9 text tokens.
  assert split.eval_WxT.tolist() == [[1, 100, 101, 102], [1, 103, 104, 105]]
  assert split.calib_WxT.tolist() == [[1, 121, 122, 123], [1, 124, 125, 126],
                                      [1, 127, 128, 129]]
  assert split.calib_range == (21, 30) and split.eval_range == (0, 6)
