"""`experiments.serve_bench` end to end on the tiny Hugging Face checkpoint,
and the inputs it refuses before anything compiles."""

from __future__ import annotations

import json

import pytest

from kvq_jax.serving import bench_runner
from tests.fixtures.tiny_hf_model import write_eval_text, write_tiny_model

ARGS = dict(kinds=["bf16", "int8"], kv_budget_mib=None,
            device_memory_gib=None, budget_requests=2, num_requests=4,
            prompt_len=12, output_len=6, lengths="fixed", arrival="all",
            max_slots=8, shared_prefix_len=0, prefix_caching=False,
            page_size=32, prefill_chunk=32, seed=0, stop_at_eos=False)


@pytest.fixture(scope="module", name="files")
def _files(tmp_path_factory):
  root = tmp_path_factory.mktemp("serve")
  return (str(write_tiny_model(root / "model")),
          str(write_eval_text(root / "text.txt")), root)


def test_serve_bench_writes_every_figure(files, capsys):
  model, text, root = files
  rows = bench_runner.main(model=model, eval_data=text, out=str(root / "out"),
                           **ARGS)
  printed = capsys.readouterr().out
  # Two full-length requests (one page each) + one page of headroom.
  assert "bf16: KV capacity 96 tokens; maximum concurrency for 18 tokens " \
         "per request 2" in printed
  assert "int8: KV capacity" in printed
  saved = json.loads((root / "out" / "serve.json").read_text())
  assert saved["machine"] and len(saved["rows"]) == 2
  base, int8 = saved["rows"]
  for key in ("effective_bytes_per_token", "pages_in_budget",
              "max_concurrency", "mean_concurrency", "preemptions",
              "requests_per_s", "output_tokens_per_s", "ttft_p50_s",
              "ttft_p99_s", "itl_p50_s", "itl_p99_s", "peak_kv_bytes",
              "peak_rss_gib", "predicted_speedup", "output_match",
              "mean_tokens_to_divergence", "compile_s"):
    assert key in int8, key
  assert base["requests_per_s_ratio"] == 1.0 and base["output_match"] == 1.0
  # int8 stores ~half bf16's bytes per token: about twice the pages.
  assert int8["pages_in_budget"] >= 2 * base["pages_in_budget"] - 1
  assert all(len(r["new_ids"]) == 6 for r in int8["requests_detail"])
  assert rows[0]["kind"] == "bf16"
  for name in ("serve.md", "serve_rps.png", "serve_concurrency.png"):
    assert (root / "out" / name).stat().st_size > 0


@pytest.mark.parametrize("change, message", [
    (dict(kinds=["bf16", "nope"]), "cache kind 'nope'"),
    (dict(budget_requests=None, kv_budget_mib=0.001),
     "at least one request's pages"),
    (dict(prompt_len=600), "exceed the model's max_position_embeddings=512"),
    (dict(page_size=24, kinds=["int8"]), "must divide one another"),
    (dict(arrival="poisson:-1"), "RATE > 0"),
    (dict(budget_requests=None), "exactly one of"),
])
def test_bad_input_is_refused(files, change, message):
  model, text, root = files
  with pytest.raises(ValueError, match=message):
    bench_runner.main(model=model, eval_data=text, out=str(root / "bad"),
                      **{**ARGS, **change})
