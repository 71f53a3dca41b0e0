"""The sensitivity sweep end to end on the tiny HF checkpoint."""

from __future__ import annotations

import csv
import json

import pytest

import kvq_jax
from kvq_jax.cache.spec import CacheSpec
from kvq_jax.cli import config_flag
from kvq_jax.facade import window_forward
from kvq_jax.research import sensitivity_table
from kvq_jax.research.sensitivity import check_formats, plan_probes
from kvq_jax.research.sensitivity_runner import (OUTPUTS, probe_windows,
                                                 run_layer_sensitivity)
from kvq_jax.settings.short_specs import parse_short_spec
from tests.fixtures import numpy_metrics
from tests.fixtures import tiny_hf_model

L = tiny_hf_model.L


def small(preset: str):
  config = config_flag._PresetParser(name="config").parse(preset)  # pylint: disable=protected-access
  config.eval.window_len = 32
  config.eval.num_windows = 2
  return config


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  root = tmp_path_factory.mktemp("sensitivity")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("KVQ_JAX_CACHE", str(root / "cache"))
    model = str(tiny_hf_model.write_tiny_model(root / "model"))
    text = str(tiny_hf_model.write_eval_text(root / "eval.txt"))
    table = run_layer_sensitivity(
        small("int4_g32"), str(root / "out"), eval_data=text, model=model,
        name="int4_g32", formats=["int8", "int2_g32_asym", "int2_pc8_asym"])
    yield {"root": root, "table": table, "workdir": root / "out",
           "model": model, "text": text}


def test_plan_counts_and_choices():
  probes = plan_probes(["int4_g32"] * 3, ["int4_g32", "fp", "int4_g32"],
                       ["int8", "int4_g32"])
  modes = [p.mode for p in probes]
  assert modes.count("all") == 1 and modes.count("all_but_one") == 3
  # Base: K 3, V 2 (layer 1 V is fp), KV 2; int8: K 3 + V 3 (layer 1 V
  # int8 differs from fp); int4_g32 repeats the base except V of layer 1.
  assert modes.count("only") == 3 + 2 + 2 + 6 + 1
  int8_k1 = next(p for p in probes if p.tensor == "K" and p.layer == 1
                 and p.k_format == "int8")
  assert int8_k1.k_choice_L == (0, 2, 0) and int8_k1.v_choice_L == (0, 0, 0)
  assert len({p.name for p in probes}) == len(probes)


def test_plan_with_separate_key_and_value_formats():
  """Static keys have no value form: K-only and V-only extra lists."""
  probes = plan_probes(["int4_st"] * 2, ["int4_lm"] * 2, ["int3_st_o1"],
                       all_but_one=False, v_formats=["int3_lm", "int2_lm"])
  extra = [p for p in probes if p.mode == "only" and "fp" in
           (p.k_format, p.v_format) and p.k_format != "int4_st"
           and p.v_format != "int4_lm"]
  assert sorted((p.tensor, p.layer, p.k_format, p.v_format) for p in extra) == [
      ("K", 0, "int3_st_o1", "fp"), ("K", 1, "int3_st_o1", "fp"),
      ("V", 0, "fp", "int2_lm"), ("V", 0, "fp", "int3_lm"),
      ("V", 1, "fp", "int2_lm"), ("V", 1, "fp", "int3_lm")]
  v2 = next(p for p in extra if p.v_format == "int2_lm" and p.layer == 1)
  assert v2.v_choice_L == (0, 3) and v2.k_choice_L == (0, 0)


def test_check_formats_takes_channel_and_rejects_fp():
  assert check_formats(["int4_g32", "int8", "int2_pc32_asym"]) == (
      "int4_g32", "int8", "int2_pc32_asym")
  with pytest.raises(ValueError, match="full precision"):
    check_formats(["fp"])


def test_outputs_written(sweep):
  workdir = sweep["workdir"]
  for name in OUTPUTS:
    assert (workdir / name).stat().st_size > 0, name
  assert (workdir / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  table = json.loads((workdir / "sensitivity.json").read_text())
  assert table == json.loads(json.dumps(sweep["table"]))
  with open(workdir / "sensitivity.csv", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == len(table["rows"])
  # 1 all + L*(K, V, KV) + L all-but-one + 2 formats * L * (K, V).
  assert len(rows) == 1 + 3 * L + L + 3 * 2 * L
  summary = (workdir / "summary.txt").read_text()
  assert "most sensitive" in summary
  full = next(line for line in summary.splitlines()
              if "all layers quantized" in line)
  assert "[" in full and "(95% CI)" in full


def test_one_compile_and_the_real_cache_agrees(sweep):
  table = sweep["table"]
  assert table["timing"]["retraces_during_sweep"] == 0
  checks = table["checks"]
  assert checks["max_abs_logit_diff_vs_real_cache"] < 1e-4
  assert checks["delta_ppl_real_cache"] == pytest.approx(
      checks["delta_ppl_selective_all"], abs=1e-4)
  assert checks["kl_mean_real_cache"] == pytest.approx(
      checks["kl_mean_selective_all"], rel=1e-4)
  all_row = next(r for r in table["rows"] if r["mode"] == "all")
  assert all_row["kl_mean"] == checks["kl_mean_selective_all"]


def test_rows_are_ordered_by_damage(sweep):
  table = sweep["table"]
  meta = table["meta"]
  assert meta["formats"] == ["int2_g32_asym", "int2_pc8_asym", "int4_g32",
                             "int8"]
  assert meta["fp_bits"] == 32 and meta["head_dim"] == tiny_hf_model.H
  assert meta["full_precision_slots"] == {
      "context": 32, "sink": 0, "residual": 0, "flush_block": None,
      "window_bits": 16}
  kl = {}
  for row in table["rows"]:
    assert row["kl_mean"] > 0  # Every probe quantizes something.
    # 2 windows: a defined 95% CI around ΔPPL.
    assert (row["delta_ppl_ci95_low"] < row["delta_ppl"]
            < row["delta_ppl_ci95_high"]), row
    if row["mode"] == "only" and row["tensor"] in ("K", "V"):
      fmt = row["k_format"] if row["tensor"] == "K" else row["v_format"]
      kl[(row["tensor"], row["layer"], fmt)] = row["kl_mean"]
  # Fewer bits, more damage, for every tensor of the random tiny model.
  for tensor in ("K", "V"):
    for layer in range(L):
      assert (kl[(tensor, layer, "int8")] < kl[(tensor, layer, "int4_g32")]
              < kl[(tensor, layer, "int2_g32_asym")])
  kv = sensitivity_table.only_matrix(table["rows"], L, "kl_mean", "KV")
  assert (kv > 0).all()


def _row(table, mode, tensor, layer, fmt=None):
  return next(r for r in table["rows"]
              if (r["mode"], r["tensor"], r["layer"]) == (mode, tensor, layer)
              and fmt in (None, r["k_format"] if tensor == "K"
                          else r["v_format"]))


def test_all_but_one_is_the_other_layers_only_probe(sweep):
  """With L = 2, 'all but layer i' quantizes exactly the other layer."""
  assert L == 2
  table = sweep["table"]
  for layer in range(L):
    probe = _row(table, "all_but_one", "KV", layer)
    other = _row(table, "only", "KV", 1 - layer)
    for metric in ("delta_ppl", "kl_mean", "top1_agreement", "ppl_quant"):
      assert probe[metric] == other[metric], (layer, metric)


@pytest.mark.parametrize("tensor,layer,fmt", [
    ("V", 0, "int2_g32_asym"),  # An extra format (choice 2 + j).
    ("K", 1, "int4_g32"),       # The base format (choice 1).
])
def test_only_row_matches_a_real_cache_and_a_numpy_oracle(
    sweep, tensor, layer, fmt):
  """The selective probe == the real cache with that one tensor quantized,
  scored by numpy (windows cut by hand, second-half scoring)."""
  lm = kvq_jax.load_model(sweep["model"])
  windows = numpy_metrics.tiny_windows(lm.tokenizer, sweep["text"], 32, 2)
  quantized = parse_short_spec(fmt)
  overrides = tuple(
      (i, quantized if (i == layer and tensor == "K") else None,
       quantized if (i == layer and tensor == "V") else None)
      for i in range(L))
  spec = CacheSpec(k=None, v=None, layer_overrides=overrides)
  want = numpy_metrics.second_half_metrics(
      windows, kvq_jax.forward_logits(lm, windows),
      window_forward(lm, spec, "float32")(windows))
  row = _row(sweep["table"], "only", tensor, layer, fmt)
  numpy_metrics.assert_matches(row, want)
  assert row["delta_ppl"] == pytest.approx(
      want["ppl_quant"] - want["ppl_baseline"], rel=1e-4, abs=1e-4)
  assert sweep["table"]["baseline"]["ppl_baseline"] == pytest.approx(
      want["ppl_baseline"], rel=1e-5)


def test_probe_windows_from_the_end_are_disjoint_from_the_start():
  ids = list(range(1000))
  start = probe_windows(ids, 100, 3, None, from_end=False)
  end = probe_windows(ids, 100, 3, None, from_end=True)
  assert start[0, 0] == 0 and start.shape == end.shape == (3, 100)
  assert end[-1, -1] == 999 and end[0, 0] == 700
  with_bos = probe_windows(ids, 100, 2, 7, from_end=True)
  assert list(with_bos[:, 0]) == [7, 7] and with_bos[-1, -1] == 999
  with pytest.raises(ValueError, match="no room"):
    probe_windows(ids[:250], 100, 3, None, from_end=True)
