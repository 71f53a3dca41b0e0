"""experiments.report's library: gathering metrics.json / sweep.csv files
into grouped markdown tables and Pareto plots (hand-made files, no model)."""

from __future__ import annotations

import json
import pathlib

import pytest

from kvq_jax.report.results_collect import collect_results
from kvq_jax.report.results_table import (data_label, group_rows, plot_paths,
                                          write_report)
from kvq_jax.sweep.table import write_csv

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WIKI = "/work/shared/data/wikitext-2-raw/wiki.test.raw"


def _metrics(**changes) -> dict:
  """A metrics.json as experiments.run writes it (key names copied from
  runs/issue11_kivi4/metrics.json), with `changes` applied."""
  metrics = {
      "preset": "int4_g32_asym", "model": "smollm2-135m", "eval_data": WIKI,
      "scoring": "second_half", "ppl_baseline": 23.511520749836325,
      "ppl_baseline_stderr": 0.7140259133329968, "num_windows": 40,
      "window_len": 512, "num_scored_tokens": 10200,
      "ppl_quant": 24.675, "ppl_quant_stderr": 0.75, "delta_ppl": 1.1635,
      "kl_mean": 0.04861, "top1_agreement": 0.87480,
      "delta_nll_mean": 0.048, "delta_nll_stderr": 0.0043,
      "delta_ppl_ci95_low": 0.9573, "delta_ppl_ci95_high": 1.3697,
      "kl_stderr": 0.00161, "top1_stderr": 0.00331,
      "kv_bits_per_element": 5.0, "kv_bits_per_element_effective": 5.0,
      "kv_bits_per_element_at_4096": 5.0,
      "kv_bits_per_element_at_32768": 5.0, "kv_bytes_per_token": 7200.0,
      "kv_fixed_bytes_per_sequence": 0, "kv_bytes_per_token_baseline": 46080.0,
      "full_precision_note": "K: none; V: none",
      "machine": "cpu", "python": "3.11.7"}
  metrics.update(changes)
  return metrics


def _write_run(folder, metrics: dict):
  folder.mkdir(parents=True)
  (folder / "config.json").write_text('{"model": "smollm2-135m"}')
  (folder / "metrics.json").write_text(json.dumps(metrics, indent=2))


def _sweep_row(name: str, bits: float, delta: float, low: float,
               high: float) -> dict:
  """A sweep.csv row (kvq_jax.sweep.table.COLUMNS) of an evaluated point."""
  return {"name": name, "source": "point", "status": "ok",
          "bits_per_element": bits, "stored_bits_per_element": bits,
          "bits_per_element_at_4096": bits, "bytes_per_token": bits * 1440,
          "fixed_bytes_per_sequence": 0, "ppl": 23.5115 + delta,
          "ppl_baseline": 23.511520749836325, "delta_ppl": delta,
          "kl_mean": 0.0906, "top1_agreement": 0.83,
          "delta_ppl_ci95_low": low, "delta_ppl_ci95_high": high,
          "delta_nll_mean": 0.1, "delta_nll_stderr": 0.01,
          "kl_stderr": 0.0027, "top1_stderr": 0.0039, "num_windows": 40,
          "window_len": 512, "num_scored_tokens": 10200, "pareto": True,
          "full_precision": "K: none; V: none"}


def _write_sweep(folder, rows, *, eval_data: str | None = None,
                 config: bool = True):
  folder.mkdir(parents=True)
  write_csv(folder / "sweep.csv", rows)
  if config:
    (folder / "config.json").write_text(json.dumps(
        {"model": "smollm2-135m", "eval": {"num_windows": 40,
                                           "window_len": 512,
                                           "scoring": "second_half"}}))
  if eval_data is not None:
    (folder / "run_info.json").write_text(json.dumps(
        {"eval_data": eval_data, "eval_seconds": 1.0}))


def _table_rows(text: str, heading: str) -> list[list[str]]:
  """Cells of the table under the group heading starting with `heading`."""
  section = text.split(heading, 1)[1].split("\n### ", 1)[0]
  lines = [line for line in section.splitlines() if line.startswith("| ")]
  return [[c.strip() for c in line.strip().strip("|").split("|")]
          for line in lines]


def test_groups_by_model_data_windows_and_says_each_baseline(tmp_path):
  runs = tmp_path / "runs"
  # One data file read from two working directories: one group.
  _write_run(runs / "a" / "int4_g32_asym", _metrics())
  _write_run(runs / "a" / "kivi4", _metrics(
      preset="kivi4", eval_data="../shared/data/wikitext-2-raw/wiki.test.raw",
      kv_bits_per_element_effective=8.083,
      kv_bits_per_element_at_4096=5.3853759765625,
      kv_fixed_bytes_per_sequence=3306240, delta_ppl=-0.0158,
      delta_ppl_ci95_low=-0.0626, delta_ppl_ci95_high=0.0311))
  _write_run(runs / "b" / "int2", _metrics(
      preset="int2_g32_asym", kv_bits_per_element_effective=3.0,
      delta_ppl=177.0, delta_ppl_ci95_low=164.0, delta_ppl_ci95_high=190.0))
  _write_run(runs / "c" / "two_windows", _metrics(
      num_windows=2, ppl_baseline=21.3722, ppl_baseline_stderr=3.1279))
  _write_run(runs / "d" / "qwen", _metrics(model="qwen2.5-coder-0.5b",
                                           ppl_baseline=31.8422))
  text = write_report(runs)
  headings = [line for line in text.splitlines() if line.startswith("### ")]
  assert headings == [
      "### `qwen2.5-coder-0.5b` on `wikitext-2-raw/wiki.test.raw`: 40 "
      "windows x 512 tokens, scoring `second_half`",
      "### `smollm2-135m` on `wikitext-2-raw/wiki.test.raw`: 2 windows x "
      "512 tokens, scoring `second_half`",
      "### `smollm2-135m` on `wikitext-2-raw/wiki.test.raw`: 40 windows x "
      "512 tokens, scoring `second_half`"]
  assert text.startswith("Results under `" + str(runs) + "` (`python -m "
                         "experiments.report`): 5 rows in 3 groups.")
  assert "Baseline (full-precision cache) PPL 21.3722 ± 3.1279." in text
  assert "PPL 31.8422 ± 0.7140. From `d/qwen/metrics.json`." in text
  assert ("PPL 23.5115 ± 0.7140. From `a/int4_g32_asym/metrics.json`, "
          "`a/kivi4/metrics.json`, `b/int2/metrics.json`.") in text
  header, *rows = _table_rows(text, "### `smollm2-135m` on "
                                 "`wikitext-2-raw/wiki.test.raw`: 40")
  assert header == ["preset", "run", "stored bits", "eff. bits @512",
                    "eff. bits @4096", "bytes/token", "fixed bytes/seq",
                    "ΔPPL [95% CI]", "KL ± stderr", "top-1 ± stderr"]
  # Sorted by effective bits at the evaluated context.
  assert [r[0] for r in rows] == ["int2_g32_asym", "int4_g32_asym", "kivi4"]
  assert rows[2][1:7] == ["`a/kivi4/metrics.json`", "5.00", "8.08", "5.39",
                          "7,200", "3,306,240"]
  assert rows[1][8:] == ["0.0486 ± 0.0016", "0.8748 ± 0.0033"]
  # One source, no fixed bytes: no run or fixed-bytes column.
  header, *_ = _table_rows(text, "### `smollm2-135m` on "
                           "`wikitext-2-raw/wiki.test.raw`: 2 ")
  assert "run" not in header and "fixed bytes/seq" not in header


def test_delta_ppl_says_when_the_ci_contains_zero(tmp_path):
  runs = tmp_path / "runs"
  _write_run(runs / "measurable", _metrics())
  _write_run(runs / "none", _metrics(
      preset="int8", delta_ppl=0.0060, delta_ppl_ci95_low=-0.0139,
      delta_ppl_ci95_high=0.0260, kv_bits_per_element_effective=8.25))
  _write_run(runs / "old", {k: v for k, v in _metrics(
      preset="old_run", kv_bits_per_element_effective=6.0).items()
                            if "ci95" not in k and "stderr" not in k})
  header, *cells = _table_rows(write_report(runs), "### ")
  rows = {r[0]: r for r in cells}
  assert header[6] == "ΔPPL [95% CI]"
  assert rows["int4_g32_asym"][6] == "+1.16 [+0.96, +1.37]"
  assert rows["int8"][6] == ("+0.006 [\u22120.014, +0.026], "
                             "no measurable change")
  # Written before the CI and stderr keys: the bare numbers.
  assert rows["old_run"][6:] == ["+1.1635", "0.04861", "0.8748"]


def test_bad_files_are_skipped_with_a_note(tmp_path):
  runs = tmp_path / "runs"
  _write_run(runs / "good", _metrics())
  (runs / "other").mkdir()
  (runs / "other" / "metrics.json").write_text('{"accuracy": 0.9}')
  (runs / "broken").mkdir()
  (runs / "broken" / "metrics.json").write_text("{not json")
  base = {k: v for k, v in _metrics(preset="baseline").items()
          if k.startswith(("ppl_baseline", "model", "eval_data", "num_",
                           "window", "scoring", "kv_bytes_per_token_base"))}
  _write_run(runs / "baseline", base)
  _write_sweep(runs / "orphan_sweep", [_sweep_row("int8", 8.25, 0.0, -0.1,
                                                  0.1)], config=False)
  (runs / "good" / "calibration.json").write_text('{"clip": 0.9}')
  collected = collect_results(runs)
  assert [r.name for r in collected.rows] == ["int4_g32_asym"]
  assert collected.notes == (
      "`baseline/metrics.json`: skipped, a baseline-only run (no quantized "
      "cache to compare)",
      "`broken/metrics.json`: skipped, not readable as JSON (Expecting "
      "property name enclosed in double quotes: line 1 column 2 (char 1))",
      "`orphan_sweep/sweep.csv`: skipped, no config.json with model and "
      "eval.scoring beside it (the sweep's model and scoring are unknown)",
      "`other/metrics.json`: skipped, not run metrics (missing model, "
      "eval_data, num_windows, window_len, scoring, ppl_baseline, ppl_quant, "
      "delta_ppl, kl_mean, top1_agreement, kv_bits_per_element_effective, "
      "kv_bytes_per_token)")
  text = write_report(runs)
  assert "Not shown:\n\n* `baseline/metrics.json`: skipped" in text
  assert "calibration.json" not in text


def test_missing_or_empty_folder_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match=r"'.*nowhere': no such directory; "
                     r"allowed: a folder holding experiments.run"):
    write_report(tmp_path / "nowhere")
  (tmp_path / "empty" / "x").mkdir(parents=True)
  (tmp_path / "empty" / "x" / "config.json").write_text("{}")
  with pytest.raises(ValueError, match=r"no quantized-cache results; allowed"
                     r": a folder with metrics.json .* \(none found\)"):
    write_report(tmp_path / "empty")
  (tmp_path / "empty" / "x" / "metrics.json").write_text("[]")
  with pytest.raises(ValueError, match=r"\(`x/metrics.json`: skipped, not a "
                     r"JSON object\)"):
    write_report(tmp_path / "empty")


def test_sweep_csv_rows_and_the_llama_cpp_column(tmp_path):
  runs = tmp_path / "runs"
  rows = [_sweep_row("int4_g32", 4.5, 2.62, 2.35, 2.90),
          _sweep_row("q4_0", 4.5, 2.75, 2.41, 3.10),
          {"name": "fp8_e5m2_g32_asym", "source": "grid",
           "status": "skipped: no groups for fp8", "pareto": False}]
  _write_sweep(runs / "old_sweep", rows)  # No run_info.json: data unknown.
  _write_sweep(runs / "new_sweep", rows[:2], eval_data=WIKI)
  _write_sweep(runs / "other_data", rows[:2], eval_data="/d/code.txt")
  text = write_report(runs, out=tmp_path / "out" / "results.md")
  assert (tmp_path / "out" / "results.md").read_text() == text
  old = _table_rows(text, "### `smollm2-135m` (data not recorded): 40 "
                    "windows x 512 tokens, scoring `second_half`")
  assert old[0][-1] == "llama.cpp ΔPPL"
  assert [r[0] for r in old[1:]] == ["int4_g32", "q4_0"]  # Order found.
  assert [r[-1] for r in old[1:]] == ["", "+4.23"]
  assert "llama.cpp ΔPPL assumes these windows are WikiText-2 test" in text
  new = _table_rows(text, "on `wikitext-2-raw/wiki.test.raw`")
  assert new[1][-1] == "" and new[2][-1] == "+4.23"
  other = _table_rows(text, "on `d/code.txt`")
  assert "llama.cpp ΔPPL" not in other[0]  # Other data: not comparable.
  assert ("`old_sweep/sweep.csv`: 1 point(s) the sweep skipped itself"
          in text)


def test_one_plot_per_group_is_written(tmp_path):
  runs = tmp_path / "runs"
  _write_run(runs / "a", _metrics())
  _write_run(runs / "b", _metrics(preset="kivi4", delta_ppl=-0.0158,
                                  kv_bits_per_element_effective=8.083))
  _write_run(runs / "c", _metrics(model="gemma3-270m", ppl_baseline=17.4))
  text = write_report(runs, plot=tmp_path / "plots" / "pareto.png")
  written = sorted((tmp_path / "plots").iterdir())
  assert [p.name for p in written] == ["pareto-1.png", "pareto-2.png"]
  assert all(p.read_bytes()[:8] == PNG_MAGIC for p in written)
  assert (f"PPL 17.4000 ± 0.7140. From `c/metrics.json`; Pareto plot "
          f"`{written[0]}`.") in text
  assert f"Pareto plot `{written[1]}`" in text
  # One group: the path as given.
  assert plot_paths("out/p.png", 1) == [pathlib.Path("out/p.png")]


def test_data_label_and_baseline_split(tmp_path):
  assert data_label("../shared/data/wikitext-2-raw/wiki.test.raw") == (
      "wikitext-2-raw/wiki.test.raw")
  assert data_label("python3.11.7-stdlib:textwrap.py") == (
      "python3.11.7-stdlib:textwrap.py")
  assert data_label(None) == "data not recorded"
  # Same settings, another baseline (e.g. bfloat16 weights): two groups.
  _write_run(tmp_path / "float32", _metrics())
  _write_run(tmp_path / "bfloat16", _metrics(ppl_baseline=23.9))
  groups = group_rows(collect_results(tmp_path).rows)
  assert [g.ppl_baseline for g in groups] == [23.511520749836325, 23.9]
