"""summary_markdown, write_run and the progress bar."""

from __future__ import annotations

import io
import json

from kvq_jax.experiment.progress import ProgressBar
from kvq_jax.experiment.report import summary_markdown, write_run

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
  assert "| ΔPPL |  |  |" in text
  assert "| max context in budget | 1,234,567 |  |" in text
  assert text.rstrip().endswith("machine: cpu")


def test_summary_with_quant_values():
  metrics = BASE | {"ppl_quant": 12.5, "delta_ppl": 0.1543211, "kl_mean": 0.01,
                    "compression_vs_bf16": 3.5555, "speedup_estimate": 2.1676}
  text = summary_markdown("int4_g32", metrics, "cpu")
  assert "| PPL | 12.3457 | 12.5000 |" in text
  assert "| ΔPPL |  | +0.1543 |" in text
  assert "| compression vs bf16 |  | 3.56x |" in text
  assert "| decode speed-up estimate |  | 2.17x |" in text


def test_write_run(tmp_path):
  out = write_run(tmp_path / "a" / "b", '{"x": 1}', {"ppl_baseline": 2.5},
                  "# s\n")
  assert (out / "config.json").read_text() == '{"x": 1}'
  assert json.loads((out / "metrics.json").read_text()) == {
      "ppl_baseline": 2.5}
  assert (out / "summary.md").read_text() == "# s\n"


def test_progress_bar():
  stream = io.StringIO()
  bar = ProgressBar("eval", stream=stream, width=10)
  bar(1, 4)
  assert "eval [##........] 1/4" in stream.getvalue()
  assert not stream.getvalue().endswith("\n")
  bar(4, 4)
  assert "[##########] 4/4" in stream.getvalue()
  assert stream.getvalue().endswith("\n")
