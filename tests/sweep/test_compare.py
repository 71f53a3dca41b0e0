"""experiments.compare: a preset (with overrides) against another, paired on
the same windows of the tiny model, and the script's one-line refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvq_jax.cli import config_flag
from kvq_jax.sweep import compare
from kvq_jax.sweep import pairs as sweep_pairs
from tests.fixtures import tiny_hf_model


def test_compare_pairs_the_config_against_another(tmp_path, monkeypatch,
                                                  capsys):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  model = tiny_hf_model.write_tiny_model(tmp_path / "model")
  text = tiny_hf_model.write_eval_text(tmp_path / "eval.txt")
  config = config_flag._PresetParser(name="config").parse("int4_g32")  # pylint: disable=protected-access
  config.eval.window_len, config.eval.num_windows = 16, 2
  config.cache.k.bits = config.cache.v.bits = 2
  out = compare.run_compare(
      config, "int4_g32", "k8v4", str(tmp_path / "out"),
      overrides=["--config.cache.k.bits=2", "--config.cache.v.bits=2"],
      eval_data=str(text), model=str(model))
  assert out["a"]["name"] == "int4_g32" and out["b"]["name"] == "k8v4"
  assert out["a"]["bits_per_element"] == 2 + 16 / 32  # The override: int2.
  kls = sweep_pairs.load_kl_sums(tmp_path / "out" / "per_window.npz")
  sums, tokens = sweep_pairs.load_window_sums(tmp_path / "out" /
                                              "per_window.npz")
  assert out["paired"]["num_windows"] == 2
  assert out["paired"]["delta_nll_diff"] == pytest.approx(
      (sums["int4_g32"] - sums["k8v4"]).sum() / (2 * tokens), rel=1e-5)
  assert out["paired"]["kl_diff"] == pytest.approx(
      (kls["int4_g32"] - kls["k8v4"]).sum() / (2 * tokens), rel=1e-5)
  assert out["commands"]["a"] == (
      "python -m experiments.run --config=int4_g32 --config.cache.k.bits=2 "
      f"--config.cache.v.bits=2 --eval_data={text} --model={model}")
  assert out["commands"]["b"].startswith(
      "python -m experiments.run --config=k8v4 --eval_data=")
  saved = json.loads((tmp_path / "out" / "compare.json").read_text())
  assert saved["paired"] == out["paired"]
  printed = capsys.readouterr().out
  assert "int4_g32 - k8v4, paired over 2 windows: ΔNLL" in printed


def test_a_preset_against_itself_is_refused(tmp_path):
  config = config_flag._PresetParser(name="config").parse("k8v4")  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="is the same preset"):
    compare.run_compare(config, "k8v4", "k8v4", str(tmp_path))


def test_the_script_needs_both_sides_in_one_line():
  done = subprocess.run([sys.executable, "-m", "experiments.compare",
                         "--config=k8v4"], capture_output=True, text=True,
                        timeout=120, check=False)
  assert done.returncode != 0
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and "--against" in lines[0], done.stderr
