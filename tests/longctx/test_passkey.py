"""Passkey prompts (counted by hand), the scorer, and a tiny end-to-end run."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from kvq_jax.cli import config_flag
from kvq_jax.loaders.tokenizer import TextTokenizer, load_hf_tokenizer
from kvq_jax.longctx import decoding
from kvq_jax.longctx import passkey
from tests.longctx import tiny_model

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Hand counts under the word-level tokenizer (tiny_model.count_tokens):
TASK_LEN = 13 + 6 + 10  # Three sentences, each with its '.'.
# "The grass is green ." ... "Here we go ." "There and back again ."
UNIT_LEN = 5 + 5 + 5 + 4 + 5
NEEDLE_LEN = 4 + 5 + 1 + 2 + 1 + 5 + 4 + 1  # Digits are one token each.
QUESTION_LEN = 6 + 4  # "What is the pass key ?" "The pass key is"
# Sentence boundaries inside one filler unit (tokens before each boundary).
UNIT_BOUNDARIES = (0, 5, 10, 15, 19, 24)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return tiny_model.write_model(tmp_path_factory.mktemp("passkey") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
  return load_hf_tokenizer(model_dir)


def _words(tokenizer, ids) -> list[str]:
  return tokenizer.decode(list(ids)).split()


def test_hand_counts_match_the_tokenizer(tokenizer):
  for text, n in ((passkey.TASK, TASK_LEN),
                  (passkey.FILLER_SENTENCES, UNIT_LEN),
                  (passkey.NEEDLE.format(key="71432"), NEEDLE_LEN),
                  (passkey.QUESTION, QUESTION_LEN)):
    assert tiny_model.count_tokens(text) == n
    assert len(tokenizer.encode(text)) == n


@pytest.mark.parametrize("depth, before", [
    (0, 0), (25, 10), (50, 24), (75, 34), (100, 48)])
def test_prompt_has_exact_length_and_the_key_at_its_depth(tokenizer, depth,
                                                          before):
  # Two filler units: F = 48 tokens. Targets round(d * 48 / 100) = 0, 12,
  # 24, 36, 48 move to the nearest sentence end: 0, 10 (not 15), 24,
  # 34 (24 + 10, not 24 + 15), 48.
  context = TASK_LEN + NEEDLE_LEN + QUESTION_LEN + 2 * UNIT_LEN
  filler = passkey.filler_source(tokenizer, "sentences", None)
  prompt = passkey.build_prompt(tokenizer, filler, context, depth, "71432")
  assert prompt.ids_T.size == context == 110
  assert prompt.filler_len == 48 and prompt.filler_before == before
  assert prompt.needle_start == TASK_LEN + before
  assert prompt.needle_depth == pytest.approx(100 * before / 48)
  words = _words(tokenizer, prompt.ids_T)
  assert " ".join(words[:TASK_LEN]) == (
      "There is an important info hidden inside a lot of irrelevant text . "
      "Find it and memorize them . I will quiz you about the important "
      "information there .")
  needle = words[prompt.needle_start:prompt.needle_start + NEEDLE_LEN]
  assert " ".join(needle) == ("The pass key is 7 1 4 3 2 . Remember it . "
                              "7 1 4 3 2 is the pass key .")
  # The key appears in the key sentence only, once stated twice.
  assert "".join(words).count("71432") == 2
  assert " ".join(words[-QUESTION_LEN:]) == (
      "What is the pass key ? The pass key is")
  filler_words = (words[TASK_LEN:prompt.needle_start]
                  + words[prompt.needle_start + NEEDLE_LEN:-QUESTION_LEN])
  assert " ".join(filler_words) == " ".join(
      _words(tokenizer, tokenizer.encode(passkey.FILLER_SENTENCES)) * 2)
  assert before % UNIT_LEN in UNIT_BOUNDARIES  # A sentence boundary.


def test_filler_is_cut_mid_unit_to_hit_the_length_and_bos_counts(tokenizer):
  bos_tok = TextTokenizer(tokenizer.hf, bos_id=1, eos_id=2, add_bos=True)
  filler = passkey.filler_source(bos_tok, "sentences", None)
  context = 1 + TASK_LEN + NEEDLE_LEN + QUESTION_LEN + 30
  prompt = passkey.build_prompt(bos_tok, filler, context, 100, "12345")
  assert prompt.ids_T.size == context
  assert prompt.ids_T[0] == 1 and np.sum(prompt.ids_T == 1) == 1
  assert prompt.prefix_len == 1 + TASK_LEN and prompt.filler_len == 30
  assert prompt.filler_before == 30  # Depth 100: right before the question.
  too_short = 1 + TASK_LEN + NEEDLE_LEN + QUESTION_LEN - 1
  with pytest.raises(ValueError, match="allowed: contexts >= 63"):
    passkey.build_prompt(bos_tok, filler, too_short, 50, "12345")


def test_text_filler_uses_consecutive_text_per_key(tokenizer, tmp_path):
  text = tiny_model.write_text(tmp_path / "t.txt", repeats=3)
  filler = passkey.filler_source(tokenizer, "text", str(text))
  assert filler.ids.size == 3 * (TASK_LEN + UNIT_LEN)
  first = filler.take(40, 0)
  second = filler.take(40, 1)
  np.testing.assert_array_equal(first, filler.ids[:40])
  np.testing.assert_array_equal(second, filler.ids[40:80])
  with pytest.raises(ValueError, match="fewer than the 1000 filler tokens"):
    filler.take(1000, 0)


def test_keys_are_fixed_five_digit_and_differ_between_cells():
  keys = {passkey.passkey(0, c, d, j) for c in (1024, 2048)
          for d in (0, 50) for j in range(3)}
  assert len(keys) == 12 and all(len(k) == 5 and k.isdigit() for k in keys)
  assert passkey.passkey(0, 1024, 50, 1) == passkey.passkey(0, 1024, 50, 1)
  assert passkey.passkey(1, 1024, 50, 1) != passkey.passkey(0, 1024, 50, 1)


@pytest.mark.parametrize("answer, ok", [
    (" 71432", True), (" 71432.", True), ("71432 is the pass key", True),
    (" 71432\n71432", True), (" 7143", False), (" 714320", False),
    (" 71 432", False), (" 12345 71432", False), (" the key", False),
    ("", False)])
def test_exact_match_scorer(answer, ok):
  assert passkey.score_answer(answer, "71432") is ok


def test_request_validation():
  with pytest.raises(ValueError, match="--depths"):
    passkey.PasskeyRequest(depths=(0, 101))
  with pytest.raises(ValueError, match="--contexts"):
    passkey.PasskeyRequest(contexts=(0,))
  with pytest.raises(ValueError, match="--filler='words'"):
    passkey.PasskeyRequest(filler="words")


def _config():
  return config_flag._PresetParser(name="config").parse("int4_g32_asym")  # pylint: disable=protected-access


def test_end_to_end_writes_every_output(model_dir, tmp_path, monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  request = passkey.PasskeyRequest(contexts=(110,), depths=(0, 50, 100),
                                   keys_per_cell=2, answer_tokens=4,
                                   prefill_chunk=55)
  out = passkey.run_passkey(_config(), tmp_path / "out", request,
                            points="int2_g32_asym", model=str(model_dir))
  rows = out["rows"]
  assert [(r["preset"], r["depth"]) for r in rows] == [
      ("baseline", 0), ("baseline", 50), ("baseline", 100),
      ("int2_g32_asym", 0), ("int2_g32_asym", 50), ("int2_g32_asym", 100)]
  samples = out["samples"]
  assert len(samples) == 2 * 3 * 2
  for r in rows:
    assert r["total"] == r["baseline_total"] == 2
    assert 0 <= r["both_correct"] <= min(r["correct"], r["baseline_correct"])
  for s in samples:  # The scorer decided every sample from its answer.
    assert s["correct"] == passkey.score_answer(s["answer"], s["key"])
  base = {(s["depth"], s["index"]): s for s in samples
          if s["preset"] == "baseline"}
  for s in samples:  # Same prompts (keys and positions) for every pass.
    twin = base[(s["depth"], s["index"])]
    assert (s["key"], s["needle_start"]) == (twin["key"], twin["needle_start"])
  files = tmp_path / "out"
  with open(files / "passkey.csv", encoding="utf-8") as f:
    assert len(list(csv.DictReader(f))) == 6
  saved = json.loads((files / "passkey.json").read_text())
  assert saved["presets"] == ["baseline", "int2_g32_asym"]
  assert len(saved["samples"]) == 12 and saved["peak_rss_gib"] > 0
  for png in ("passkey_baseline.png", "passkey_int2_g32_asym.png"):
    assert (files / png).read_bytes()[:8] == PNG_MAGIC
  summary = (files / "summary.md").read_text()
  assert "## baseline" in summary and "## int2_g32_asym" in summary
  assert "Machine:" in summary and "peak RSS" in summary
  assert "tells nothing about the cache" in summary or (
      "The baseline answers every sample correctly." in summary)
  assert json.loads((files / "config.json").read_text())["model"] == str(
      model_dir)


def test_contexts_beyond_the_model_are_refused(model_dir, tmp_path,
                                               monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  request = passkey.PasskeyRequest(contexts=(256, 513), depths=(50,),
                                   keys_per_cell=1)
  with pytest.raises(ValueError, match="--contexts=513: 513 tokens exceed "
                     "the model's max_position_embeddings=512"):
    passkey.run_passkey(_config(), tmp_path / "out", request,
                        model=str(model_dir))
  assert not (tmp_path / "out").exists()


def test_bad_points_fail_before_the_model_loads(tmp_path, monkeypatch):
  def never(*args, **kwargs):
    raise AssertionError("loaded the model before checking --points")
  monkeypatch.setattr(decoding, "load_model", never)
  request = passkey.PasskeyRequest(contexts=(256,), depths=(50,),
                                   keys_per_cell=1)
  with pytest.raises(ValueError, match=r"--points item 'int9'"):
    passkey.run_passkey(_config(), tmp_path / "out", request,
                        points="int8,int9", model="unused")


@pytest.mark.parametrize("spec_name", [None, "kivi2"])
def test_shared_prefill_is_bit_identical(model_dir, tmp_path, monkeypatch,
                                         spec_name):
  """Prompts resumed from the shared filler prefix get exactly the cache and
  logits of a prefill from scratch, with fewer prefill calls."""
  import jax  # pylint: disable=import-outside-toplevel
  from kvq_jax.facade import load_model  # pylint: disable=import-outside-toplevel
  from kvq_jax.longctx import decoding  # pylint: disable=import-outside-toplevel
  from kvq_jax.models.runtime import Runtime  # pylint: disable=import-outside-toplevel
  from kvq_jax.sweep.points import parse_points  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  lm = load_model(str(model_dir), "float32")
  runtime = Runtime(lm.decoder)
  spec = None if spec_name is None else parse_points(
      [spec_name], None, head_dim=lm.config.head_dim,
      num_layers=lm.config.num_layers)[0].spec
  request = passkey.PasskeyRequest(contexts=(200,), depths=(0, 60, 100),
                                   keys_per_cell=2, prefill_chunk=32)
  filler = passkey.filler_source(lm.tokenizer, "sentences", None)
  prompts = sorted(passkey.make_prompts(lm.tokenizer, filler, request),
                   key=lambda p: p.needle_start)
  shared = decoding.SharedPrefill(runtime, spec, "float32", chunk=32)
  from_scratch = 0
  for p in prompts:
    capacity = p.ids_T.size + 3
    got_V, got = shared.prefill(p.ids_T, p.needle_start, capacity)
    want_V, want = decoding.prefill_chunked(
        runtime, decoding.new_cache(runtime, spec, capacity, "float32"),
        p.ids_T, 32)
    from_scratch += -(-p.ids_T.size // 32)
    np.testing.assert_array_equal(got_V, want_V)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert from_scratch == 6 * 7
  # Depth 0 shares nothing past the task; depth 60: 3 chunks before the key
  # (needle at ~118), depth 100: 5 (needle at ~171): the trunk runs 5 chunks
  # once, the prompts 7 + 7 + 4 + 4 + 2 + 2.
  assert shared.chunks_run == 5 + 26 < from_scratch
  # A prompt that does not match the trunk restarts it (still exact).
  other = np.asarray(prompts[-1].ids_T)[::-1].copy()
  got_V, _ = shared.prefill(other, 150, 203)
  want_V, _ = decoding.prefill_chunked(
      runtime, decoding.new_cache(runtime, spec, 203, "float32"), other, 32)
  np.testing.assert_array_equal(got_V, want_V)


def test_presets_answer_only_baseline_correct_prompts(model_dir, tmp_path,
                                                      monkeypatch):
  monkeypatch.setenv("KVQ_JAX_CACHE", str(tmp_path / "cache"))
  # The tiny random model cannot retrieve: call key 0 of each cell right for
  # every pass, so the baseline is right exactly on key 0.
  answered = []

  def score(answer, key):
    answered.append(key)
    return key in first_keys
  first_keys = {passkey.passkey(0, 110, d, 0) for d in (0, 100)}
  monkeypatch.setattr(passkey, "score_answer", score)
  request = passkey.PasskeyRequest(contexts=(110,), depths=(0, 100),
                                   keys_per_cell=3, answer_tokens=2,
                                   prefill_chunk=55,
                                   presets_on="baseline_correct")
  out = passkey.run_passkey(_config(), tmp_path / "out", request,
                            points="int8", model=str(model_dir))
  assert len(answered) == 6 + 2  # The preset answered key 0 of each cell.
  for r in out["rows"]:
    if r["preset"] == "int8":
      assert (r["correct"], r["total"], r["baseline_correct"]) == (1, 1, 1)
  summary = (tmp_path / "out" / "summary.md").read_text()
  assert "--presets_on=baseline_correct" in summary
  assert "| 110 | 1/1 \u2020 | 1/1 \u2020 |" in summary
  with pytest.raises(ValueError, match="--presets_on='some': allowed: all, "
                     "baseline_correct"):
    passkey.PasskeyRequest(presets_on="some")
