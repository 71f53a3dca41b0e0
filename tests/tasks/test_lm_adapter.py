"""The lm-eval adapter's three calls on a tiny model: its log-likelihoods
equal the project's own NLL of the same tokens, its rolling windows cover
every token once, and generate_until is the engine's greedy decode cut at a
stop string. lm-eval itself is an optional extra (tests/tasks/test_lm_eval_harness.py
runs it where installed); `KvqJaxLM` only unwraps `Instance.args` into
these calls."""

from __future__ import annotations

import numpy as np
import pytest

import kvq_jax
from kvq_jax.eval.evaluate import evaluate_windows
from kvq_jax.eval.windows import scored_mask
from kvq_jax.facade import window_forward
from kvq_jax.models.generate import generate
from kvq_jax.tasks.lm_adapter import CacheLM, cut_at_stops
from kvq_jax.settings.experiment_settings import settings_from_config
from tests.fixtures import tiny_hf_model
from tests.fixtures.preset_specs import load_preset

CONTEXT = "the cat sat on the mat and the dog"
CONTINUATION = " sat on the log."


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
  root = tmp_path_factory.mktemp("tiny")
  return kvq_jax.load_model(str(tiny_hf_model.write_tiny_model(root / "m")))


@pytest.fixture(scope="module", params=["baseline", "kivi2"])
def adapter(request, lm):
  if request.param == "baseline":
    return CacheLM(lm, None, "float32", max_length=64)
  spec = settings_from_config(load_preset(request.param)).cache_spec
  return CacheLM(lm, spec, "float32", max_length=64)


def _project_nll(lm, spec, ids, scored):
  """Sum of the evaluation's NLL over the last `scored` predictions of one
  window (`evaluate_windows`, the path every PPL here comes from)."""
  window = np.asarray(ids, np.int32)[None]
  mask = scored_mask(len(ids), f"last_{scored}")
  base = window_forward(lm, None, "float32")
  quant = window_forward(lm, spec, "float32") if spec is not None else None
  result = evaluate_windows(window, mask, base, quant)
  ppl = result.quant if quant is not None else result.baseline
  assert ppl.count == scored
  return ppl.mean_nll * ppl.count


def test_loglikelihood_equals_the_projects_nll(lm, adapter):
  tok = lm.tokenizer
  ctx, cont = tok.encode(CONTEXT), tok.encode(CONTINUATION, add_bos=False)
  [(logprob, greedy)] = adapter.loglikelihood([(CONTEXT, CONTINUATION)])
  want = _project_nll(lm, adapter.spec, ctx + cont, len(cont))
  assert logprob == pytest.approx(-want, abs=1e-5)
  assert isinstance(greedy, bool)


def _greedy(lm, ids, n):
  return list(generate(lm.decoder, None, ids, n, cache_dtype="float32",
                       eos_id=-1).new_ids)


def test_is_greedy_when_the_continuation_is_the_argmax(lm):
  adapter = CacheLM(lm, None, "float32", max_length=64)
  ids = lm.tokenizer.encode(CONTEXT)
  new = _greedy(lm, ids, 3)
  _, greedy = adapter.token_logprobs(ids + new, 3)
  assert greedy
  other = new[:2] + [(new[2] + 1) % lm.config.vocab_size]
  _, greedy = adapter.token_logprobs(ids + other, 3)
  assert not greedy


def test_rolling_windows_predict_every_token_once(lm):
  adapter = CacheLM(lm, None, "float32", max_length=8)
  text = " ".join(tiny_hf_model.SENTENCES)
  full = [lm.tokenizer.bos_id] * bool(lm.tokenizer.add_bos) + \
      lm.tokenizer.encode(text, add_bos=False)
  windows = adapter.rolling_windows(text)
  predicted = [t for ids, count in windows for t in ids[-count:]]
  assert predicted == full[1:]
  assert all(len(ids) <= 8 and count < len(ids) for ids, count in windows)
  [total] = adapter.loglikelihood_rolling([(text,)])
  want = sum(_project_nll(lm, None, ids, count) for ids, count in windows)
  assert total == pytest.approx(-want, abs=1e-4)


def test_generate_until_is_greedy_and_cut_at_the_stop(lm, adapter):
  limit = 6
  [free, cut] = adapter.generate_until(
      [(CONTEXT, {"max_gen_toks": limit}),
       (CONTEXT, {"until": ["the"], "max_gen_toks": limit})])
  assert cut == cut_at_stops(free, ["the"])
  if adapter.spec is None:  # The dense cache: generate's own tokens.
    ids = lm.tokenizer.encode(CONTEXT)
    out = generate(lm.decoder, None, ids, limit, cache_dtype="float32")
    assert free == lm.tokenizer.decode(list(out.new_ids),
                                       skip_special_tokens=True)


def test_sampling_is_refused(lm):
  adapter = CacheLM(lm, None, "float32")
  with pytest.raises(ValueError, match="only greedy"):
    adapter.generate_until([(CONTEXT, {"do_sample": True})])
