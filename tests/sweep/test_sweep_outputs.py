"""CSV and PNG outputs, and one tiny end-to-end sweep."""

from __future__ import annotations

import json
import math

import pytest

from kvq_jax.cli import config_flag
from kvq_jax.sweep import reference
from kvq_jax.sweep.plot import pareto_plot
from kvq_jax.sweep import pairs as sweep_pairs
from kvq_jax.sweep.runner import SweepRequest, run_sweep
from kvq_jax.sweep.table import read_csv, text_table, write_csv
from tests.fixtures import tiny_hf_model

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_csv_round_trip_and_png(tmp_path):
  rows = [
      {"name": "int4_g32", "source": "grid", "status": "ok",
       "bits_per_element": 4.5, "delta_ppl": 0.3, "ppl": 24.0, "pareto": True,
       "num_windows": 4},
      {"name": "k8v4", "source": "point", "status": "ok",
       "bits_per_element": 6.5, "delta_ppl": 0.5, "ppl": 24.2,
       "pareto": False, "num_windows": 4},
      {"name": "fp8_e4m3_g32_asym", "source": "grid",
       "status": "skipped: fp8 is symmetric", "pareto": False},
  ]
  write_csv(tmp_path / "s.csv", rows)
  back = read_csv(tmp_path / "s.csv")
  assert [r["name"] for r in back] == [r["name"] for r in rows]
  assert back[0]["bits_per_element"] == 4.5 and back[0]["pareto"] is True
  assert back[0]["num_windows"] == 4 and back[2]["ppl"] is None
  pareto_plot(back, tmp_path / "p.png")
  assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC


def test_csv_round_trips_paired_columns_and_reads_older_csvs(tmp_path):
  row = {"name": "int4_g32", "source": "grid", "status": "ok",
         "delta_ppl": 0.08, "delta_ppl_ci95_low": -0.02,
         "delta_ppl_ci95_high": 0.18, "delta_nll_stderr": math.nan,
         "pareto": False}
  write_csv(tmp_path / "s.csv", [row])
  back = read_csv(tmp_path / "s.csv")[0]
  assert back["delta_ppl_ci95_low"] == -0.02
  assert back["delta_ppl_ci95_high"] == 0.18
  assert math.isnan(back["delta_nll_stderr"]) and back["kl_stderr"] is None
  old = (tmp_path / "s.csv").read_text().splitlines()
  header = old[0].split(",")
  keep = [i for i, c in enumerate(header) if "ci95" not in c
          and "stderr" not in c and c != "delta_nll_mean"]
  (tmp_path / "old.csv").write_text("\n".join(
      ",".join(line.split(",")[i] for i in keep) for line in old) + "\n")
  assert read_csv(tmp_path / "old.csv")[0]["delta_ppl_ci95_low"] is None


def test_text_table_prints_delta_with_ci():
  ok = {"status": "ok", "bits_per_element": 4.5, "ppl": 12.5, "kl_mean": 0.01,
        "top1_agreement": 0.97, "pareto": True}
  rows = [
      ok | {"name": "int4_g32", "delta_ppl": 0.0812,
            "delta_ppl_ci95_low": -0.0214, "delta_ppl_ci95_high": 0.1838},
      ok | {"name": "int2_g32_asym", "delta_ppl": -1.234,
            "delta_ppl_ci95_low": -2.5, "delta_ppl_ci95_high": -0.1,
            "pareto": False},
      ok | {"name": "one_window", "delta_ppl": 0.3,
            "delta_ppl_ci95_low": math.nan, "delta_ppl_ci95_high": math.nan},
      ok | {"name": "old_row", "delta_ppl": 0.25},
      {"name": "skipped", "status": "skipped: x", "pareto": False},
  ]
  lines = text_table(rows).splitlines()
  assert lines[0].split()[:6] == ["name", "eff.", "bits", "stored", "ppl",
                                  "dPPL"]
  by_name = {line.split()[0]: line for line in lines[1:-1]}
  assert set(by_name) == {"int4_g32", "int2_g32_asym", "one_window",
                          "old_row"}
  assert by_name["int4_g32"].split()[4:9] == [
      "+0.08", "[\u22120.02,", "+0.18]", "no", "0.0100"]
  assert by_name["int4_g32"].rstrip().endswith("*")
  assert by_name["int2_g32_asym"].split()[4:8] == [
      "\u22121.2", "[\u22122.5,", "\u22120.1]", "yes"]
  assert "+0.3 [no CI: needs" in by_name["one_window"]
  assert "n/a" in by_name["one_window"] and "n/a" in by_name["old_row"]
  assert lines[-1].startswith("eff. bits: effective bits/element")
  assert "dPPL: paired, 95% CI over windows" in lines[-1]
  # Columns are aligned: every row is as wide up to the KL column.
  kl_at = {line.index("0.0100") for line in lines[1:-1]}
  assert len(kl_at) == 1


def test_llama_cpp_reference_is_relative_to_its_f16():
  f16 = reference.LLAMA_CPP_POINTS[0]
  assert reference.llama_cpp_delta_ppl(f16) == 0.0
  q4_0 = [p for p in reference.LLAMA_CPP_POINTS if p.name == "q4_0"][0]
  assert q4_0.bits_per_element == 4.5
  assert reference.llama_cpp_delta_ppl(q4_0) == pytest.approx(4.227)


def test_llama_cpp_reference_names_our_points_and_its_protocol():
  assert reference.llama_cpp_point_for("q8_0/q4_0").name == "K q8_0 + V q4_0"
  assert reference.llama_cpp_point_for("q4_0").ppl == 27.805
  assert reference.llama_cpp_point_for("int4_g32") is None
  wiki = "../shared/data/wikitext-2-raw/wiki.test.raw"
  assert reference.matches_llama_cpp_protocol(
      "smollm2-135m", wiki, 40, 512, "second_half")
  # Not recorded (older sweeps): the model and windows decide.
  assert reference.matches_llama_cpp_protocol(
      "smollm2-135m", None, 40, 512, "second_half")
  for other in (("qwen2.5-coder-0.5b", wiki, 40, 512, "second_half"),
                ("smollm2-135m", "/d/wiki.train.raw", 40, 512, "second_half"),
                ("smollm2-135m", wiki, 4, 512, "second_half"),
                ("smollm2-135m", wiki, 40, 1024, "second_half"),
                ("smollm2-135m", wiki, 40, 512, "all")):
    assert not reference.matches_llama_cpp_protocol(*other), other


def test_tiny_end_to_end_sweep(tmp_path, monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  model = tiny_hf_model.write_tiny_model(tmp_path / "model")
  text = tiny_hf_model.write_eval_text(tmp_path / "eval.txt")
  config = config_flag._PresetParser(name="config").parse("int4_g32")  # pylint: disable=protected-access
  config.eval.window_len, config.eval.num_windows = 16, 1
  rows = run_sweep(
      config, tmp_path / "out",
      SweepRequest(formats=("int2", "fp8_e5m2"), group_sizes=(32,),
                   schemes=("asym",), residuals=(0,), points="k8v4",
                   pairs=("int2_g32_asym:k8v4",)),
      eval_data=str(text), model=str(model))
  by_name = {r["name"]: r for r in rows}
  assert by_name["fp8_e5m2_g32_asym"]["status"].startswith("skipped")
  ok = [r for r in rows if r["status"] == "ok"]
  assert sorted(r["name"] for r in ok) == ["int2_g32_asym", "k8v4"]
  int2 = by_name["int2_g32_asym"]
  assert int2["bits_per_element"] == 2 + 32 / 32  # bf16 scale + zero.
  assert int2["bytes_per_token"] == 2 * 2 * 32 * 3 / 8
  for r in ok:
    assert math.isfinite(r["ppl"]) and r["kl_mean"] > 0  # Lossy: KL > 0.
    assert r["delta_ppl"] == pytest.approx(r["ppl"] - r["ppl_baseline"])
    # One window: the window-clustered uncertainties are undefined, not 0.
    assert math.isnan(r["delta_ppl_ci95_low"]), r
    assert math.isnan(r["delta_nll_stderr"]) and math.isnan(r["kl_stderr"])
  # One baseline for all points.
  assert ok[0]["ppl_baseline"] == ok[1]["ppl_baseline"]
  assert any(r["pareto"] for r in ok)
  assert read_csv(tmp_path / "out" / "sweep.csv")[0]["name"] == ok[0]["name"]
  png = (tmp_path / "out" / "pareto.png").read_bytes()
  assert png[:8] == PNG_MAGIC
  info = json.loads((tmp_path / "out" / "run_info.json").read_text())
  assert info["passes_per_window"] == 3 and info["eval_seconds_per_window"] > 0
  assert info["eval_data"] == str(text)
  assert 0.05 < info["peak_rss_gib"] < 24 and "cpus" in info["machine"]
  # The per-window sums give back each point's mean ΔNLL, and the pair is
  # their difference (one window: no stderr, so no verdict but "none").
  sums, tokens = sweep_pairs.load_window_sums(tmp_path / "out" /
                                              "per_window.npz")
  for r in ok:
    assert sums[r["name"]].sum() / (tokens * len(sums[r["name"]])) == \
        pytest.approx(r["delta_nll_mean"], rel=1e-6)
  pair = (tmp_path / "out" / "pairs.csv").read_text().splitlines()
  assert pair[1].startswith("int2_g32_asym,k8v4,")
  row = dict(zip(pair[0].split(","), pair[1].split(",")))
  assert row["verdict"] == "no measurable change"
  # The KL pair: the difference of the two points' KL means.
  kls = sweep_pairs.load_kl_sums(tmp_path / "out" / "per_window.npz")
  assert float(row["kl_diff"]) == pytest.approx(
      (kls["int2_g32_asym"] - kls["k8v4"]).sum() / tokens, rel=1e-5)
  assert float(row["kl_diff"]) == pytest.approx(
      by_name["int2_g32_asym"]["kl_mean"] - by_name["k8v4"]["kl_mean"],
      rel=1e-4)
  with pytest.raises(ValueError, match="not points of this sweep"):
    run_sweep(config, tmp_path / "out2", SweepRequest(
        formats=(), points="k8v4", pairs="k8v4:int8"),
              eval_data=str(text), model=str(model))
