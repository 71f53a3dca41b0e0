"""summary_markdown and write_run (`report.run_summary`)."""

from __future__ import annotations

import json

from kvq_jax.report.run_summary import summary_markdown, write_run

BASE = {"model": "m", "eval_data": "d", "num_windows": 2, "window_len": 32,
        "scoring": "all", "num_scored_tokens": 62, "ppl_baseline": 12.3456789,
        "ppl_baseline_stderr": 0.5, "kv_bytes_per_token_baseline": 512.0,
        "max_context_tokens_baseline": 1234567,
        "decode_tokens_per_s_baseline": 99.0}


def test_summary_baseline_only_leaves_quant_column_empty():
  text = summary_markdown("baseline", BASE, "cpu")
  assert text.startswith("# baseline\n")
  assert "2 windows x 32 tokens, scoring `all` (62 scored predictions)" in text
  assert "| PPL | 12.3457 |  |" in text
  assert "| max context in budget | 1,234,567 |  |" in text
  assert "ΔPPL" not in text  # Rows without any value are left out.
  assert "uncertainties:" not in text
  assert text.rstrip().endswith("machine: cpu")


def test_summary_without_ci_keys_prints_the_bare_delta():
  metrics = BASE | {"ppl_quant": 12.5, "delta_ppl": 0.1543211, "kl_mean": 0.01,
                    "compression_vs_bf16": 3.5555, "speedup_estimate": 2.1676}
  text = summary_markdown("int4_g32", metrics, "cpu")
  assert "| PPL | 12.3457 | 12.5000 |" in text
  assert "| ΔPPL |  | +0.1543 |" in text
  assert "| KL(base‖quant) mean ± stderr |  | 0.01000 |" in text
  assert "| compression vs bf16 |  | 3.56x |" in text
  assert "| decode speed-up, memory-bound model |  | 2.17x |" in text


PAIRED = {"ppl_quant": 12.5, "delta_ppl": 0.0812, "delta_ppl_ci95_low": -0.0214,
          "delta_ppl_ci95_high": 0.1838, "delta_nll_mean": 0.00655,
          "delta_nll_stderr": 0.0042, "kl_mean": 0.012345, "kl_stderr": 0.00061,
          "top1_agreement": 0.9651, "top1_stderr": 0.0213}


def test_summary_delta_with_ci_and_no_measurable_change():
  text = summary_markdown("int4_g32", BASE | PAIRED, "cpu")
  assert ("| ΔPPL |  | +0.08 [\u22120.02, +0.18], no measurable "
          "change |") in text
  assert "| ΔNLL / token ± stderr |  | +0.0066 ± 0.0042 |" in text
  assert "| KL(base‖quant) mean ± stderr |  | 0.01235 ± 0.00061 |" in text
  assert "| top-1 agreement ± stderr |  | 0.965 ± 0.021 |" in text
  assert "ΔPPL [low, high] is a 95% CI" in text
  assert "clustered over the 2 windows" in text
  assert "undefined" not in text


def test_summary_measurable_negative_delta():
  metrics = BASE | PAIRED | {"delta_ppl": -0.5, "delta_ppl_ci95_low": -0.71,
                             "delta_ppl_ci95_high": -0.29}
  text = summary_markdown("q", metrics, "cpu")
  assert "| ΔPPL |  | \u22120.50 [\u22120.71, \u22120.29] |" in text


def test_summary_single_window_says_ci_is_undefined():
  nan = float("nan")
  metrics = BASE | PAIRED | {"num_windows": 1, "delta_ppl_ci95_low": nan,
                             "delta_ppl_ci95_high": nan,
                             "delta_nll_stderr": nan, "kl_stderr": nan,
                             "top1_stderr": nan}
  text = summary_markdown("q", metrics, "cpu")
  assert "| ΔPPL |  | +0.0812 [no CI: needs ≥ 2 windows] |" in text
  assert "| top-1 agreement ± stderr |  | 0.965 ± n/a |" in text
  assert "With 1 window the standard errors and the CI are undefined" in text
  assert "no measurable change" not in text.split("uncertainties:")[0]


def test_summary_bits_bytes_speed_rows_and_notes():
  metrics = BASE | PAIRED | {
      "kv_bits_per_element": 4.5, "kv_bits_per_element_effective": 7.25,
      "kv_bits_per_element_at_4096": 4.6123, "kv_bits_per_element_at_32768":
      4.5142, "kv_bytes_per_sequence": 1234567.0, "speedup_estimate": 2.5,
      "decode_speedup_measured": 0.8123,
      "full_precision_note": "the last 128 tokens stay in bf16",
      "speed_note": "fake quantization dequantizes on every step"}
  text = summary_markdown("q", metrics, "cpu")
  for row in (
      "| stored bits / element (codes+scales+zeros) |  | 4.500 |",
      "| effective bits / element at window_len (incl. full-precision "
      "tokens) |  | 7.250 |",
      "| effective bits / element at 4,096 tokens |  | 4.612 |",
      "| effective bits / element at 32,768 tokens |  | 4.514 |",
      "| KV bytes / sequence at window_len |  | 1,234,567 |",
      "| decode speed-up, memory-bound model |  | 2.50x |",
      "| decode speed-up, measured |  | 0.81x |"):
    assert row in text, row
  table_end = text.index("machine:")
  assert text.index("full precision: the last 128 tokens stay in bf16") < \
      table_end
  assert "speed: fake quantization dequantizes on every step" in text
  # Notes come after the table, each as its own paragraph.
  last_row = max(i for i, line in enumerate(text.splitlines())
                 if line.startswith("|"))
  note = text.splitlines().index(
      "full precision: the last 128 tokens stay in bf16")
  assert note > last_row + 1


def test_summary_leaves_out_absent_new_rows():
  text = summary_markdown("q", BASE | PAIRED, "cpu")
  for label in ("stored bits", "effective bits", "KV bytes / sequence",
                "decode speed-up", "full precision:", "speed:"):
    assert label not in text, label


def test_write_run(tmp_path):
  out = write_run(tmp_path / "a" / "b", '{"x": 1}', {"ppl_baseline": 2.5},
                  "# s\n")
  assert (out / "config.json").read_text() == '{"x": 1}'
  assert json.loads((out / "metrics.json").read_text()) == {
      "ppl_baseline": 2.5}
  assert (out / "summary.md").read_text() == "# s\n"
