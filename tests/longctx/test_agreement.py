"""Decode agreement: self-agreement, teacher forcing, divergence, outputs."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from kvq_jax.cli import config_flag
from kvq_jax.facade import load_model
from kvq_jax.longctx import agreement, decoding
from kvq_jax.models.runtime import Runtime
from kvq_jax.sweep.points import parse_point
from tests.longctx import tiny_model

NEW_TOKENS = 20
CHUNK = 20  # Two prefill chunks of a 40-token prompt.


class RecordingRuntime(Runtime):
  """A Runtime that records every token its decode step is given."""

  def __init__(self, model):
    super().__init__(model)
    self.fed: list[int] = []

  def decode(self, token_B, cache, position_B=None):
    self.fed.append(int(np.asarray(token_B)[0]))
    return super().decode(token_B, cache, position_B)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("agreement")
  model_dir = tiny_model.write_model(root / "model")
  text = tiny_model.write_text(root / "text.txt")
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("KVQ_JAX_CACHE", str(root / "cache"))
    lm = load_model(str(model_dir))
  ids = np.asarray(lm.tokenizer.encode(text.read_text()), np.int32)
  request = agreement.AgreementRequest(num_prompts=2, prefix_lens=(40,),
                                       new_tokens=NEW_TOKENS,
                                       prefill_chunk=CHUNK)
  prompts = agreement.prompts_for(ids, None, request)
  return lm, model_dir, text, request, prompts


def _spec(item: str):
  return parse_point(item, None).spec


def test_step_ranges_clip_to_the_decode_length():
  assert agreement.step_ranges(128) == [(1, 16), (17, 64), (65, 128)]
  assert agreement.step_ranges(32) == [(1, 16), (17, 32)]
  assert agreement.step_ranges(10) == [(1, 10)]
  assert agreement.step_ranges(200) == [(1, 16), (17, 64), (65, 128),
                                        (129, 200)]


def test_prompts_are_consecutive_slices_with_bos(setup):
  *_, request, prompts = setup
  ids = np.arange(100, dtype=np.int32) + 3
  with_bos = agreement.prompts_for(ids, 1, request)[40]
  np.testing.assert_array_equal(with_bos[:, 0], [1, 1])
  np.testing.assert_array_equal(with_bos[0, 1:], ids[:39])
  np.testing.assert_array_equal(with_bos[1, 1:], ids[39:78])
  assert prompts[40].shape == (2, 40)
  with pytest.raises(ValueError, match="needs 120 text tokens"):
    agreement.prompts_for(ids, None, agreement.AgreementRequest(
        num_prompts=3, prefix_lens=(40,)))


def test_baseline_against_itself_agrees_perfectly(setup):
  lm, _, _, request, prompts = setup
  results, continuations = agreement.measure(
      Runtime(lm.decoder), prompts, [("self", None)], "float32", request)
  comparisons = results[("self", 40)]
  assert len(comparisons) == 2 and len(continuations[40]) == 2
  for c in comparisons:
    assert c.first_divergence == NEW_TOKENS and c.identical
    np.testing.assert_array_equal(c.kl_N, np.zeros(NEW_TOKENS))
    np.testing.assert_array_equal(c.top1_N, np.ones(NEW_TOKENS))
  row = agreement.aggregate("self", 40, comparisons, NEW_TOKENS)
  assert row["first_divergence_mean"] == NEW_TOKENS
  assert row["identical_fraction_mean"] == 1.0
  assert row["kl_mean"] == 0.0 and row["kl_stderr"] == 0.0
  assert row["kl_steps_17_20_mean"] == 0.0


def test_teacher_forcing_feeds_the_baseline_tokens(setup):
  lm, _, _, request, prompts = setup
  runtime = RecordingRuntime(lm.decoder)
  prompt_T = prompts[40][0]
  base = decoding.run_sequence(runtime, None, "float32", prompt_T,
                               NEW_TOKENS, chunk=CHUNK)
  # Greedy: each step fed its own argmax; the last one is never fed.
  assert runtime.fed == base.argmax_N[:-1].tolist() == base.fed_N.tolist()
  runtime.fed.clear()
  results, _ = agreement.measure(runtime, {40: prompts[40][:1]},
                                 [("int2", _spec("int2_g32_asym"))],
                                 "float32", request)
  # measure: the baseline's greedy pass, then the preset fed the same tokens.
  n = NEW_TOKENS - 1
  assert runtime.fed[:n] == base.argmax_N[:-1].tolist()
  assert runtime.fed[n:] == base.argmax_N[:-1].tolist()
  # The preset's own choices differ somewhere, yet it was fed the baseline's.
  comparison = results[("int2", 40)][0]
  assert comparison.first_divergence < NEW_TOKENS
  assert np.all(comparison.kl_N >= 0) and comparison.kl_N.mean() > 0


def test_forced_steps_see_exactly_the_forced_prefix(setup):
  lm, *_, prompts = setup
  runtime = Runtime(lm.decoder)
  prompt_T = prompts[40][1]
  # Arbitrary tokens, not the model's choices.
  forced = (np.arange(NEW_TOKENS - 1, dtype=np.int32) * 7 + 5) % 50 + 3
  steps = decoding.run_sequence(runtime, None, "float32", prompt_T,
                                NEW_TOKENS, forced_N=forced, chunk=CHUNK)
  assert np.any(steps.argmax_N[:-1] != forced)
  np.testing.assert_array_equal(steps.fed_N, forced)
  # One prefill of prompt + forced tokens gives the same distributions.
  full = np.concatenate([prompt_T, forced])
  cache = decoding.new_cache(runtime, None, full.size, "float32")
  logits_1xTxV, _ = runtime.prefill(full[None], cache)
  expected = np.asarray(logits_1xTxV[0, prompt_T.size - 1:], np.float32)
  np.testing.assert_allclose(steps.logits_NxV, expected, atol=1e-4)


def test_divergence_equals_the_free_running_greedy_decode(setup):
  lm, *_, prompts = setup
  runtime = Runtime(lm.decoder)
  spec = _spec("int2_g32_asym")
  for prompt_T in prompts[40]:
    base = decoding.run_sequence(runtime, None, "float32", prompt_T,
                                 NEW_TOKENS, chunk=CHUNK)
    forced = decoding.run_sequence(runtime, spec, "float32", prompt_T,
                                   NEW_TOKENS, forced_N=base.argmax_N[:-1],
                                   chunk=CHUNK)
    free = decoding.run_sequence(runtime, spec, "float32", prompt_T,
                                 NEW_TOKENS, chunk=CHUNK, keep_logits=False)
    comparison = agreement.compare_steps(base, forced, int(prompt_T[-1]))
    differs = np.flatnonzero(free.argmax_N != base.argmax_N)
    free_divergence = int(differs[0]) if differs.size else NEW_TOKENS
    assert comparison.first_divergence == free_divergence
    # Identical up to the divergence: the same tokens went into both caches.
    d = comparison.first_divergence
    np.testing.assert_array_equal(free.argmax_N[:d + 1],
                                  forced.argmax_N[:d + 1])


def _config():
  return config_flag._PresetParser(name="config").parse("int4_g32_asym")  # pylint: disable=protected-access


def test_end_to_end_writes_every_output(setup, tmp_path, monkeypatch):
  _, model_dir, text, request, _ = setup
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  out = agreement.run_agreement(
      _config(), tmp_path / "out", request, points="int4_g32_asym,int8",
      eval_data=str(text), model=str(model_dir))
  rows = out["rows"]
  assert [r["preset"] for r in rows] == ["int4_g32_asym", "int8"]
  for r in rows:
    assert r["kl_mean"] > 0 and math.isfinite(r["kl_stderr"])  # Lossy.
    assert 0 <= r["first_divergence_mean"] <= NEW_TOKENS
    assert 0 <= r["identical_fraction_mean"] <= 1
    assert r["num_prompts"] == 2 and r["prefix_len"] == 40
    assert {"kl_steps_1_16_mean", "kl_steps_17_20_stderr"} <= set(r)
  files = tmp_path / "out"
  with open(files / "agreement.csv", encoding="utf-8") as f:
    assert [r["preset"] for r in csv.DictReader(f)] == ["int4_g32_asym",
                                                        "int8"]
  saved = json.loads((files / "agreement.json").read_text())
  assert len(saved["per_step"]["int8@40"]["kl_by_step"]) == NEW_TOKENS
  assert len(saved["baseline_continuations"]["40"]) == 2
  summary = (files / "summary.md").read_text()
  assert "| int4_g32_asym | 40 |" in summary and "KL steps 17-20" in summary
  assert "Machine:" in summary and "peak RSS" in summary
  assert (files / "config.json").is_file()


def test_too_long_prefix_plus_decode_is_refused(setup, tmp_path,
                                                monkeypatch):
  _, model_dir, text, _, _ = setup
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  request = agreement.AgreementRequest(num_prompts=1, prefix_lens=(500,),
                                       new_tokens=14)
  with pytest.raises(ValueError, match="--prefix_lens=500 with "
                     "--new_tokens=14: 513 tokens exceed"):
    agreement.run_agreement(_config(), tmp_path / "out", request,
                            eval_data=str(text), model=str(model_dir))


def test_batched_rows_match_one_prompt_at_a_time(setup):
  """run_rows over a batch gives each prompt its batch-1 result (up to
  float rounding), teacher forcing included."""
  lm, *_, prompts = setup
  runtime = Runtime(lm.decoder)
  batch = prompts[40]
  forced_BxN = (np.arange(2 * (NEW_TOKENS - 1), dtype=np.int32).reshape(
      2, -1) * 5 + 3) % 50 + 3
  rows = decoding.run_rows(runtime, None, "float32", batch, NEW_TOKENS,
                           forced_BxN, chunk=CHUNK)
  for b in range(2):
    one = decoding.run_sequence(runtime, None, "float32", batch[b],
                                NEW_TOKENS, forced_N=forced_BxN[b],
                                chunk=CHUNK)
    np.testing.assert_allclose(rows[b].logits_NxV, one.logits_NxV,
                               atol=1e-4)
    np.testing.assert_array_equal(rows[b].fed_N, forced_BxN[b])
  # measure() in batches of one and of two: the same comparisons.
  spec = _spec("int8")
  _, _, _, request, _ = setup
  import dataclasses  # pylint: disable=import-outside-toplevel
  one_at_a_time = dataclasses.replace(request, batch_size=1)
  got = {}
  for req in (request, one_at_a_time):
    results, conts = agreement.measure(runtime, {40: batch},
                                       [("int8", spec)], "float32", req)
    got[req.batch_size] = (results[("int8", 40)], conts[40])
  for a, b in zip(got[16][0], got[1][0]):
    np.testing.assert_allclose(a.kl_N, b.kl_N, atol=1e-5)
  for a, b in zip(got[16][1], got[1][1]):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="--batch_size=0"):
    agreement.AgreementRequest(batch_size=0)
