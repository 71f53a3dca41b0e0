"""Key-stats recipes built on first use (`calibration.auto_key_stats`)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from kvq_jax.assets import entry_marker
from kvq_jax.calibration import auto_key_stats
from kvq_jax.calibration.key_runner import calibrate_keys
from kvq_jax.calibration.key_stats import KeyStatsOptions
from kvq_jax.persist.key_stats_store import SIDECAR, load_key_stats
from kvq_jax.settings import key_stats_context
from kvq_jax.settings.experiment_settings import settings_from_config
from tests.fixtures import tiny_hf_model

RANGE99 = "auto:mode=range,range_quantile=0.99"


def test_recipes_parse_to_key_stats_options():
  assert auto_key_stats.parse_recipe("auto") == KeyStatsOptions()
  assert auto_key_stats.parse_recipe(RANGE99) == KeyStatsOptions(
      mode="range", range_quantile=0.99)
  assert auto_key_stats.parse_recipe(
      "auto:mode=range,codebook_bits=2|4,outliers=1,shift=false") == (
          KeyStatsOptions(mode="range", codebook_bits=(2, 4), outliers=1,
                          shift=False))
  assert not key_stats_context.is_recipe("runs/key_stats/x")
  assert not key_stats_context.is_recipe("automatic")


@pytest.mark.parametrize("recipe, message", [
    ("auto:bits=3", "name among alpha"),
    ("auto:mode=median", "allowed: std, range"),
    ("auto:shift=yes", "is not a bool"),
    ("auto:range_quantile=high", "is not a float"),
    ("auto:range_quantile", "name=value"),
])
def test_bad_recipes_say_what_is_allowed(recipe, message):
  with pytest.raises(ValueError, match=message):
    auto_key_stats.parse_recipe(recipe)


@pytest.fixture(name="tiny")
def _tiny(tmp_path, monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  config, text = tiny_hf_model.calibration_preset(tmp_path, "kq3")
  config.cache.key_stats = RANGE99
  return config, text


def _settings(config, text, model=None):
  with auto_key_stats.run_context(model or config.model, text):
    return settings_from_config(config)


def _arrays(affines):
  return [np.concatenate([np.ravel(x) for x in a.arrays()]) for a in affines]


def test_first_use_builds_what_calibrate_keys_writes_then_reuses_it(
    tiny, tmp_path, capsys):
  config, text = tiny
  built = _settings(config, text)
  source = built.key_stats_source
  assert source["built_now"] and source["recipe"] == RANGE99
  assert "none cached; calibrating on tokens" in capsys.readouterr().err
  # The calibration tokens are the last 4 windows of 32, after the 2
  # evaluation windows of 32 (no BOS for this tokenizer).
  start, stop = source["calibration_tokens"]
  assert stop - start == 4 * 32 and start >= 2 * 32

  explicit = calibrate_keys(
      config, str(tmp_path / "explicit"), eval_data=text,
      num_calib_windows=4,
      options=KeyStatsOptions(mode="range", range_quantile=0.99))
  assert explicit["calibration_tokens"] == [start, stop]
  for got, want in zip(_arrays(built.cache_spec.key_affines),
                       _arrays(load_key_stats(explicit["path"]))):
    np.testing.assert_array_equal(got, want)

  again = _settings(config, text)
  assert not again.key_stats_source["built_now"]
  assert again.key_stats_source["path"] == source["path"]
  assert "calibrating" not in capsys.readouterr().err


def test_a_damaged_entry_is_rebuilt(tiny):
  config, text = tiny
  first = _settings(config, text)
  entry = pathlib.Path(first.key_stats_source["path"])
  entry_marker.check_marker(entry)
  (entry / SIDECAR).write_text("{}")
  with pytest.raises(entry_marker.Unusable):
    entry_marker.check_marker(entry)
  rebuilt = _settings(config, text)
  assert rebuilt.key_stats_source["built_now"]
  entry_marker.check_marker(entry)


def test_another_text_or_recipe_gets_its_own_entry(tiny, tmp_path):
  config, text = tiny
  first = _settings(config, text)
  other_text = tiny_hf_model.write_eval_text(tmp_path / "other.txt",
                                             repeats=7)
  second = _settings(config, str(other_text))
  config.cache.key_stats = "auto:mode=range"
  third = _settings(config, text)
  paths = {s.key_stats_source["path"] for s in (first, second, third)}
  assert len(paths) == 3


def test_run_context_and_decorator_name_the_model(tiny):
  config, text = tiny

  @auto_key_stats.resolves_for_run
  def experiment(config, workdir, eval_data=None, model=None):
    del workdir
    return settings_from_config(config), key_stats_context.resolved_in_run()

  settings, resolved = experiment(config, "unused", eval_data=text)
  assert settings.key_stats_source["model"] == config.model
  assert list(resolved) == [RANGE99]
  assert key_stats_context.current() is None  # Reset on the way out.


def test_a_recipe_without_a_model_is_refused(tiny):
  config, _ = tiny
  with pytest.raises(ValueError, match="no run names one"):
    settings_from_config(config)


def test_evaluating_every_window_would_overlap_the_calibration(tiny):
  config, text = tiny
  config.eval.num_windows = 0
  with pytest.raises(ValueError, match="would evaluate on them"):
    _settings(config, text)


def test_explicit_directory_wins_and_another_models_is_refused(tiny,
                                                               tmp_path):
  config, text = tiny
  written = calibrate_keys(
      config, str(tmp_path / "ks"), eval_data=text,
      options=KeyStatsOptions(mode="range", range_quantile=0.99))
  config.cache.key_stats = written["path"]
  settings = _settings(config, text)
  assert settings.key_stats_source == {"path": written["path"]}
  sidecar = json.loads((tmp_path / "ks" / SIDECAR).read_text())
  assert sidecar["metadata"]["model"] == config.model
  with pytest.raises(ValueError, match="calibrated for model"):
    _settings(config, text, model="smollm2-135m")
