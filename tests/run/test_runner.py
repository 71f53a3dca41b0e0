"""runner.run and `python -m experiments.run` end to end on a tiny model."""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

import kvq_jax
from configs import base as base_config
from kvq_jax import facade
from kvq_jax.cli import config_flag
from kvq_jax.run import runner
from kvq_jax.settings.experiment_settings import settings_from_config
from tests.fixtures import numpy_metrics as numpy_metrics_lib
from tests.fixtures import tiny_hf_model

REPO = pathlib.Path(__file__).resolve().parents[2]

QUANT_KEYS = ("ppl_quant", "ppl_quant_stderr", "delta_ppl", "kl_mean",
              "top1_agreement", "decode_tokens_per_s_quant",
              "kv_bits_per_element", "kv_bytes_per_token",
              "compression_vs_bf16", "max_context_tokens_quant",
              "speedup_estimate")
ISSUE_KEYS = (
    "ppl_baseline", "ppl_baseline_stderr", "ppl_quant", "ppl_quant_stderr",
    "delta_ppl", "kl_mean", "top1_agreement", "kv_bits_per_element",
    "kv_bytes_per_token", "kv_bytes_per_token_baseline", "compression_vs_bf16",
    "max_context_tokens_baseline", "max_context_tokens_quant",
    "speedup_estimate", "decode_tokens_per_s_baseline",
    "decode_tokens_per_s_quant", "num_windows", "window_len",
    "num_scored_tokens")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  root = tmp_path_factory.mktemp("runner")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("KVQ_JAX_CACHE", str(root / "cache"))
    yield {"root": root, "cache": root / "cache",
           "model": str(tiny_hf_model.write_tiny_model(root / "model")),
           "text": str(tiny_hf_model.write_eval_text(root / "eval.txt"))}


def small(preset: str):
  config = config_flag._PresetParser(name="config").parse(preset)  # pylint: disable=protected-access
  config.eval.window_len = 32
  config.eval.num_windows = 2
  config.decode_bench.context = 16
  config.decode_bench.batch_size = 1
  config.decode_bench.steps = 1
  return config


def numpy_metrics(env, config) -> dict:
  """The run's eval metrics recomputed in numpy from the raw logits."""
  settings = settings_from_config(config)
  assert settings.eval.scoring == "second_half"
  lm = kvq_jax.load_model(env["model"], settings.dtype)
  windows = numpy_metrics_lib.tiny_windows(
      lm.tokenizer, env["text"], settings.eval.window_len,
      settings.eval.num_windows)
  quant = None
  if settings.quantize:
    quant = facade.window_forward(lm, settings.cache_spec,
                                  settings.cache_dtype)(windows)
  return numpy_metrics_lib.second_half_metrics(
      windows, kvq_jax.forward_logits(lm, windows), quant)


assert_matches_numpy = numpy_metrics_lib.assert_matches


def run(env, config, name):
  workdir = env["root"] / name
  metrics = runner.run(config, str(workdir), eval_data=env["text"],
                       model=env["model"], name=name)
  assert metrics == json.loads((workdir / "metrics.json").read_text())
  return metrics, workdir


def test_int4_g32_run_writes_every_output(env):
  metrics, workdir = run(env, small("int4_g32"), "int4_g32")
  for key in ISSUE_KEYS:
    assert key in metrics and metrics[key] is not None, key
  assert metrics["num_windows"] == 2 and metrics["window_len"] == 32
  assert metrics["num_scored_tokens"] == 2 * (31 - 16)
  for key in ("ppl_baseline", "ppl_quant", "decode_tokens_per_s_baseline",
              "decode_tokens_per_s_quant", "eval_seconds_per_window"):
    assert math.isfinite(metrics[key]) and metrics[key] > 0, key
  # A JAX process holding a model has RSS well above 50 MiB, below 24 GiB.
  assert 0.05 < metrics["peak_rss_gib_eval"] < 24
  assert "peak RSS after evaluation" in (workdir / "summary.md").read_text()
  assert_matches_numpy(metrics, numpy_metrics(env, small("int4_g32")))
  assert metrics["kl_mean"] > 1e-4  # int4 really changed the logits.
  assert metrics["delta_ppl"] == pytest.approx(
      metrics["ppl_quant"] - metrics["ppl_baseline"])
  # Tiny model: 2 layers * (K + V) * 1 head * 32 dims.
  assert metrics["kv_bits_per_element"] == 4.5
  assert metrics["kv_bytes_per_token"] == 2 * 2 * 32 * 4.5 / 8
  assert metrics["kv_bytes_per_token_baseline"] == 2 * 2 * 32 * 4
  assert metrics["compression_vs_bf16"] == pytest.approx(16 / 4.5)
  assert metrics["max_context_tokens_quant"] > metrics[
      "max_context_tokens_baseline"]
  assert metrics["eval_data"] == env["text"]
  assert metrics["model"] == env["model"]
  config = json.loads((workdir / "config.json").read_text())
  assert config["cache"]["k"]["bits"] == 4 and config["eval"]["window_len"] == 32
  assert config["model"] == env["model"]  # --model is what ran.
  summary = (workdir / "summary.md").read_text()
  assert summary.startswith("# int4_g32\n") and "| ΔPPL |" in summary
  # The converted params were cached under $KVQ_JAX_CACHE, not ~/.cache.
  assert any((env["cache"] / "params").iterdir())


def test_baseline_run_has_no_quant_keys(env):
  metrics, workdir = run(env, small("baseline"), "baseline")
  assert_matches_numpy(metrics, numpy_metrics(env, small("baseline")))
  for key in QUANT_KEYS:
    assert key not in metrics, key
  for key in ("ppl_baseline", "ppl_baseline_stderr",
              "kv_bytes_per_token_baseline", "max_context_tokens_baseline",
              "decode_tokens_per_s_baseline", "num_scored_tokens"):
    assert key in metrics, key
  assert "| PPL |" in (workdir / "summary.md").read_text()


def test_full_precision_quant_run_matches_baseline(env):
  config = small("int4_g32")
  config.cache.k = base_config.kv(type="none")
  config.cache.v = base_config.kv(type="none")
  config.cache.dtype = "float32"
  metrics, _ = run(env, config, "fp32_as_quant")
  assert metrics["delta_ppl"] == pytest.approx(0.0, abs=1e-9)
  assert metrics["kl_mean"] == pytest.approx(0.0, abs=1e-6)
  assert metrics["top1_agreement"] == 1.0
  assert metrics["compression_vs_bf16"] == pytest.approx(0.5)
  assert metrics["kv_bits_per_element"] == 32


def test_bf16_cache_is_close_to_baseline(env):
  metrics, _ = run(env, small("bf16"), "bf16")
  assert_matches_numpy(metrics, numpy_metrics(env, small("bf16")))
  assert abs(metrics["delta_ppl"]) < 0.01 * metrics["ppl_baseline"]
  assert 0 < metrics["kl_mean"] < 1e-3  # bfloat16 rounding: small, not 0.
  assert metrics["compression_vs_bf16"] == 1.0


def test_too_many_windows_is_a_value_error(env):
  config = small("baseline")
  config.eval.num_windows = 1000
  with pytest.raises(ValueError, match=r"eval\.num_windows=1000.*allowed 1\.\."):
    run(env, config, "too_many")


def test_budget_below_weights_fails_before_evaluating(env, monkeypatch):
  def never(*args, **kwargs):
    raise AssertionError("evaluated despite an impossible memory budget")
  monkeypatch.setattr(runner, "evaluate_windows", never)
  config = small("int4_g32")
  config.memory.budget_gib = 1e-6
  with pytest.raises(ValueError, match=r"budget_gib=1e-06: the weights alone"):
    run(env, config, "tiny_budget")


def test_window_longer_than_the_model_fails_before_compiling(env,
                                                            monkeypatch):
  def never(*args, **kwargs):
    raise AssertionError("compiled a window the model cannot position")
  monkeypatch.setattr(runner, "window_forward", never)
  config = small("int4_g32")
  config.eval.window_len = 600  # The tiny model has 512 positions.
  with pytest.raises(ValueError, match=r"eval\.window_len=600: 600 tokens "
                     r"exceed the model's max_position_embeddings=512"):
    run(env, config, "too_long")


def test_model_without_tokenizer_rejected(env, tmp_path):
  bare = tiny_hf_model.write_tiny_model(tmp_path / "bare")
  (bare / "tokenizer.json").unlink()
  with pytest.raises(ValueError, match="has no tokenizer"):
    runner.run(small("baseline"), str(tmp_path / "out"),
               eval_data=env["text"], model=str(bare))


def _cli(env, *args):
  proc_env = dict(os.environ, KVQ_JAX_CACHE=str(env["cache"]),
                  JAX_PLATFORMS="cpu")
  return subprocess.run(
      [sys.executable, "-m", "experiments.run", *args], cwd=REPO,
      env=proc_env, capture_output=True, text=True, timeout=300, check=False)


def test_command_line_run(env):
  workdir = env["root"] / "cli"
  result = _cli(env, f"--model={env['model']}", f"--eval_data={env['text']}",
                "--config=baseline", "--config.eval.window_len=32",
                "--config.eval.num_windows=2",
                "--config.decode_bench.context=16",
                "--config.decode_bench.batch_size=1",
                "--config.decode_bench.steps=1", f"--workdir={workdir}")
  assert result.returncode == 0, result.stderr[-3000:]
  metrics = json.loads((workdir / "metrics.json").read_text())
  assert metrics["preset"] == "baseline" and metrics["num_windows"] == 2
  assert "ppl_quant" not in metrics
  assert (workdir / "summary.md").is_file() and (workdir / "config.json").is_file()
  # Quiet by default (log_setup): no orbax/jax INFO line (absl's "I<date>"
  # prefix), kvq_jax's own phase lines bare, where the files went last.
  assert not re.search(r"^I\d{4} ", result.stderr, re.M), result.stderr
  assert re.search(r"^(Loaded|Caching) converted params ", result.stderr,
                   re.M), result.stderr
  for phase in ("tokenized: ", "decode benchmark: "):
    assert phase in result.stderr, result.stderr
  assert result.stdout.rstrip().endswith(
      f"wrote {workdir}/: config.json, metrics.json, summary.md")


def test_command_line_unknown_preset_lists_presets(env):
  result = _cli(env, "--config=nonexistent",
                f"--workdir={env['root'] / 'never'}")
  assert result.returncode != 0
  assert "no preset named 'nonexistent'" in result.stderr
  assert "int4_g32" in result.stderr and "kivi2" in result.stderr
  assert not (env["root"] / "never").exists()
