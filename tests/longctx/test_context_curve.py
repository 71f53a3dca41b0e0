"""experiments.context_curve: chunked prefill, last_N scoring, outputs."""

from __future__ import annotations

import csv
import functools
import json
import math

import numpy as np
import pytest

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.cli import config_flag
from kvq_jax.eval.evaluate import evaluate_many
from kvq_jax.eval.windows import (check_scoring, logits_needed, scored_mask)
from kvq_jax.facade import LoadedModel, chunked_window_forward, window_forward
from kvq_jax.longctx import curve
from kvq_jax.longctx.curve_table import COLUMNS
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.quant import QuantSpec
from tests.fixtures import tiny_hf_model
from tests.models.tiny import TINY

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T, CHUNK, KEEP = 40, 16, 20  # Chunks 16 + 16 + 8: the last one shorter.
INT4_G8_ASYM = QuantSpec("int4", "asymmetric", "per_group", 8)
SPECS = {
    "dense": None,
    "int4_g8_asym": CacheSpec(k=INT4_G8_ASYM, v=INT4_G8_ASYM, block_size=16),
    # Per-channel keys wait in full precision until their 8-token group
    # closes: chunk boundaries (16, 32) and the window's end (40) fall at
    # different offsets of that wait. float32 window: see tests/cache.
    "kivi_pc8": CacheSpec(
        k=QuantSpec("int4", "asymmetric", "per_channel", 8), v=INT4_G8_ASYM,
        block_size=16, window_dtype="float32"),
}


@functools.lru_cache(maxsize=None)
def tiny_model() -> LoadedModel:
  decoder = decoder_from_params(TINY, random_params(TINY, seed=5, scale=0.1))
  return LoadedModel(decoder=decoder, tokenizer=None, source="tiny")


def tokens() -> np.ndarray:
  return np.random.default_rng(0).integers(
      0, TINY.vocab_size, (2, T)).astype(np.int32)


@pytest.mark.parametrize("name", list(SPECS))
def test_chunked_prefill_matches_one_shot(name):
  lm, ids = tiny_model(), tokens()
  one_shot = np.asarray(window_forward(lm, SPECS[name])(ids))
  chunked = np.asarray(chunked_window_forward(lm, SPECS[name], chunk=CHUNK,
                                              keep=KEEP)(ids))
  # One unscored full chunk (scan without logits), one scored full chunk,
  # then the 8-token remainder: the last KEEP positions come back.
  assert chunked.shape == (2, KEEP, TINY.vocab_size)
  # Same cache contents; only matmul shapes (and so float rounding) differ.
  np.testing.assert_allclose(chunked, one_shot[:, T - KEEP:], atol=1e-5,
                             rtol=0)


def test_chunked_prefill_refuses_bad_arguments():
  with pytest.raises(ValueError, match=r"eval\.prefill_chunk=0: allowed"):
    chunked_window_forward(tiny_model(), chunk=0)
  with pytest.raises(ValueError, match=r"keep=0 logits positions"):
    chunked_window_forward(tiny_model(), chunk=8, keep=0)


def test_last_n_scoring_mask_by_hand():
  # 8 tokens -> predictions j = 0..6 (target j + 1); last_3 counts j = 4, 5, 6.
  np.testing.assert_array_equal(
      scored_mask(8, "last_3"), [False, False, False, False, True, True, True])
  np.testing.assert_array_equal(scored_mask(8, "last_7"), [True] * 7)
  mask = scored_mask(512, "last_256")
  assert int(mask.sum()) == 256 and int(np.argmax(mask)) == 255
  assert mask[255:].all() and not mask[:255].any()
  # Logits of positions 255..511 cover predictions 255..510.
  assert logits_needed(mask) == 257
  assert logits_needed(scored_mask(8, "second_half")) == 4  # j = 4, 5, 6.
  assert logits_needed(scored_mask(8, "all")) == 8
  assert check_scoring("last_256") == 256 and check_scoring("all") is None
  with pytest.raises(ValueError, match=r"needs windows of at least 257"):
    scored_mask(256, "last_256")
  for bad in ("last_0", "last_x", "last", "half"):
    with pytest.raises(ValueError, match=r"all, second_half, last_N"):
      check_scoring(bad)


def test_evaluate_many_tail_equals_full_logits():
  lm, ids = tiny_model(), tokens()
  mask = scored_mask(T, "last_8")
  spec = SPECS["int4_g8_asym"]
  # Batches of both windows: the forwards compiled above are reused.
  full = evaluate_many(ids, mask, window_forward(lm),
                       {"q": window_forward(lm, spec)},
                       batch_size=2)["q"].metrics()
  tail = evaluate_many(
      ids, mask, chunked_window_forward(lm, chunk=CHUNK, keep=KEEP),
      {"q": chunked_window_forward(lm, spec, chunk=CHUNK, keep=KEEP)},
      batch_size=2, tail=KEEP)["q"].metrics()
  assert tail["num_scored_tokens"] == full["num_scored_tokens"] == 2 * 8
  for key in ("ppl_baseline", "ppl_quant", "kl_mean", "delta_ppl_ci95_low"):
    assert tail[key] == pytest.approx(full[key], rel=1e-4, abs=1e-6), key
  with pytest.raises(ValueError, match=r"tail=20 logits cover predictions "
                     r"20\.\.38, but the mask scores earlier ones"):
    evaluate_many(ids, scored_mask(T, "all"), window_forward(lm), {},
                  tail=KEEP)


def test_contexts_checked_and_windows_capped():
  assert curve.check_contexts([64, 32], 512, False) == (32, 64)
  with pytest.raises(ValueError, match=r"--contexts 1024 exceed the model's "
                     r"trained context \(max_position_embeddings=512\).*"
                     r"--allow_beyond_trained"):
    curve.check_contexts([512, 1024], 512, False)
  assert curve.check_contexts([1024], 512, True) == (1024,)
  with pytest.raises(ValueError, match="repeats a length"):
    curve.check_contexts([32, 32], 512, False)
  ids = np.arange(100, dtype=np.int32)
  short, long = curve._prepare([10, 40], ids, None, {10: 4, 40: 4}, "last_3")  # pylint: disable=protected-access
  assert short.windows_WxL.shape == (4, 10)
  assert long.windows_WxL.shape == (2, 40)  # The text holds 2, not 4.
  assert long.keep == 4
  with pytest.raises(ValueError, match="fewer than one window"):
    curve._prepare([200], ids, None, {200: 4}, "last_3")  # pylint: disable=protected-access


def test_windows_per_context():
  assert curve.windows_per_context((64, 32), 3) == {64: 3, 32: 3}
  # One count per context, in the order given (before sorting).
  assert curve.windows_per_context((64, 32), (2, 5)) == {64: 2, 32: 5}
  for bad in ((1, 2, 3), (0, 2), 0, (True, 2)):
    with pytest.raises(ValueError, match=r"--num_windows=.*allowed: one "
                       r"integer >= 1, or one per context \(2 here"):
      curve.windows_per_context((64, 32), bad)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
  root = tmp_path_factory.mktemp("curve")
  model = tiny_hf_model.write_tiny_model(root / "model")
  text = tiny_hf_model.write_eval_text(root / "eval.txt")
  return root, model, text


def _config(prefill_chunk: int = 16):
  config = config_flag._PresetParser(name="config").parse("int4_g32")  # pylint: disable=protected-access
  config.eval.prefill_chunk = prefill_chunk
  return config


def test_tiny_end_to_end_curve(tiny_checkpoint, monkeypatch):
  root, model, text = tiny_checkpoint
  monkeypatch.setenv("KVQ_JAX_CACHE", str(root / "cache"))
  seen = {}  # (spec, context) -> windows each forward was given.

  def counting(lm, spec=None, cache_dtype=None, *, chunk, keep=None):
    fn = chunked_window_forward(lm, spec, cache_dtype, chunk=chunk, keep=keep)

    def run(tokens_BxT):
      key = (spec, tokens_BxT.shape[1])
      seen[key] = seen.get(key, 0) + tokens_BxT.shape[0]
      return fn(tokens_BxT)
    return run

  monkeypatch.setattr(curve, "chunked_window_forward", counting)
  out = root / "out"
  rows = curve.run_context_curve(
      _config(), out, curve.CurveRequest(
          contexts=(64, 32), points="int8,int4_g32_asym", num_windows=(2, 2),
          scoring="last_16"),
      eval_data=str(text), model=str(model))
  assert [(r["name"], r["context"]) for r in rows] == [
      ("int8", 32), ("int4_g32_asym", 32), ("int8", 64),
      ("int4_g32_asym", 64)]
  # One baseline pass: the baseline forward saw each window once per
  # context, as did every point's.
  specs = {r["name"]: r for r in rows}
  assert {k[1] for k in seen} == {32, 64}
  assert all(n == 2 for n in seen.values()) and len(seen) == 3 * 2
  for length in (32, 64):
    at = [r for r in rows if r["context"] == length]
    assert at[0]["ppl_baseline"] == at[1]["ppl_baseline"]
    for r in at:
      assert r["num_windows"] == 2 and r["num_scored_tokens"] == 2 * 16
      assert r["prefill_chunk"] == 16 and r["scoring"] == "last_16"
      assert r["delta_ppl"] == pytest.approx(r["ppl_quant"]
                                             - r["ppl_baseline"])
      assert r["delta_ppl_ci95_low"] <= r["delta_ppl"] \
          <= r["delta_ppl_ci95_high"]
      for key in ("delta_nll_stderr", "kl_mean", "kl_stderr", "top1_stderr",
                  "seconds", "baseline_seconds", "peak_rss_gib"):
        assert math.isfinite(r[key]) and r[key] >= 0, key
  assert specs["int4_g32_asym"]["bits_per_element"] == 4 + 32 / 32
  with open(out / "context_curve.csv", newline="", encoding="utf-8") as f:
    back = list(csv.DictReader(f))
  assert tuple(back[0]) == COLUMNS and len(back) == 4
  assert float(back[0]["delta_ppl_ci95_low"]) == rows[0]["delta_ppl_ci95_low"]
  data = json.loads((out / "context_curve.json").read_text())
  assert [b["context"] for b in data["baseline"]] == [32, 64]
  assert data["baseline"][0]["ppl"] == rows[0]["ppl_baseline"]
  assert data["meta"]["scoring"] == "last_16" and len(data["rows"]) == 4
  assert data["config"]["eval"]["prefill_chunk"] == 16
  assert (out / "context_curve.png").read_bytes()[:8] == PNG_MAGIC
  summary = (out / "summary.md").read_text()
  assert "| preset | context | eff. bits | PPL | ΔPPL [95% CI] |" in summary
  assert "| int4_g32_asym | 64 | 5.00 |" in summary
  assert "machine: processor" in summary


def test_curve_refuses_beyond_trained_context(tiny_checkpoint, monkeypatch):
  root, model, text = tiny_checkpoint
  monkeypatch.setenv("KVQ_JAX_CACHE", str(root / "cache"))
  with pytest.raises(ValueError, match=r"max_position_embeddings=512"):
    curve.run_context_curve(
        _config(), root / "refused", curve.CurveRequest(contexts=(32, 1024)),
        eval_data=str(text), model=str(model))
  assert not (root / "refused").exists()
