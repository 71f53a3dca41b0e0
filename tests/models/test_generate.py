"""generate(): greedy determinism, argmax agreement, seeded sampling, eos."""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp
import pytest

from kvq_jax.models.generate import generate
from kvq_jax.models.runtime import Runtime

PROMPT = [5, 17, 42, 3]


@pytest.fixture(scope="module")
def runtime(tiny_model):
  return Runtime(tiny_model)


def test_greedy_is_deterministic_and_matches_full_forward_argmax(runtime):
  first = generate(runtime, None, PROMPT, 6)
  second = generate(runtime, None, PROMPT, 6)
  assert first == second and len(first.new_ids) == 6
  assert first.prompt_ids == tuple(PROMPT) and first.text is None
  seq = jnp.asarray([PROMPT + list(first.new_ids)], jnp.int32)
  logits, _ = runtime.prefill(seq, runtime.init_cache(1, seq.shape[1]))
  argmax = np.asarray(logits)[0].argmax(-1)
  np.testing.assert_array_equal(argmax[len(PROMPT) - 1:-1], first.new_ids)


def test_sampling_is_reproducible_per_seed(runtime):
  a = generate(runtime, None, PROMPT, 8, temperature=5.0, seed=1)
  b = generate(runtime, None, PROMPT, 8, temperature=5.0, seed=1)
  others = {generate(runtime, None, PROMPT, 8, temperature=5.0,
                     seed=s).new_ids for s in (2, 3)}
  assert a == b
  assert others != {a.new_ids}  # High temperature: seeds diverge.


def test_stops_at_eos(runtime):
  greedy = generate(runtime, None, PROMPT, 6).new_ids
  out = generate(runtime, None, PROMPT, 6, eos_id=greedy[2])
  assert out.new_ids == greedy[:greedy.index(greedy[2]) + 1]


class _CharTokenizer:
  """Minimal `tokenizers.Tokenizer`-like stub: one id per character."""

  class _Encoding:
    def __init__(self, ids):
      self.ids = ids

  def encode(self, text):
    return self._Encoding([ord(c) % 97 for c in text])

  def decode(self, ids):
    return "".join(chr(ord("a") + i % 26) for i in ids)


def test_text_prompt_through_tokenizer(runtime):
  tok = _CharTokenizer()
  out = generate(runtime, tok, "hi!", 3)
  assert out.prompt_ids == tuple(tok.encode("hi!").ids)
  assert out.text == tok.decode(out.new_ids)
  assert out == generate(runtime, tok, list(out.prompt_ids), 3)


@pytest.mark.parametrize("kwargs,field", [
    (dict(prompt_ids=[]), "prompt_ids"),
    (dict(prompt_ids="text"), "tokenizer"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(capacity=5), r"capacity=5; allowed: an int >= prompt \+ "
     "max_new_tokens = 6")])
def test_rejects_bad_arguments(runtime, kwargs, field):
  args = dict(prompt_ids=PROMPT, max_new_tokens=2)
  args.update(kwargs)
  with pytest.raises(ValueError, match=field):
    generate(runtime, None, **args)


def test_prefill_last_is_prefill_at_the_last_position(runtime):
  seq = jnp.asarray([PROMPT * 3, PROMPT[::-1] * 3], jnp.int32)
  logits, full_cache = runtime.prefill(seq, runtime.init_cache(2, 16))
  last, cache = runtime.prefill_last(seq, runtime.init_cache(2, 16))
  assert last.shape == (2, logits.shape[-1])
  np.testing.assert_allclose(np.asarray(last), np.asarray(logits)[:, -1],
                             rtol=1e-5, atol=1e-5)
  for a, b in zip(full_cache, cache):
    np.testing.assert_array_equal(np.asarray(a.k_BxSxKxH),
                                  np.asarray(b.k_BxSxKxH))
    np.testing.assert_array_equal(np.asarray(a.length_B),
                                  np.asarray(b.length_B))
  with pytest.raises(ValueError, match=r"prefill_last: tokens must be "
                     r"\[B, T\]"):
    runtime.prefill_last(jnp.asarray(PROMPT), runtime.init_cache(1, 8))
