"""The continuous-batching engine on the tiny float32 decoder.

A batch served by the engine (chunked prefill interleaved with decode, a
pool small enough that requests are preempted and recomputed) yields, token
for token, what each request yields alone through `models.generate` with
the same cache spec: greedy and seeded sampling alike. On the tiny float32
model the batch shapes' float rounding never moves an argmax; a real
model's bf16 or quantized cache can (a rounding flip of one stored value),
which is why `serve_bench` reports output agreement as a measurement.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvq_jax.models.generate import generate
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.runtime import Runtime
from kvq_jax.serving.engine import Engine, EngineConfig
from kvq_jax.serving.request import Request
from kvq_jax.serving.workload import Workload, make_requests, parse_arrival
from tests.cache import tiny_setup as ts

# Two prompt lengths only: `generate` compiles one prefill per length.
LENGTHS = (13, 29)


def _requests(n=6, seed=0):
  rng = np.random.default_rng(seed)
  return [Request(i, tuple(int(t) for t in rng.integers(
      0, 97, LENGTHS[i % 2])), int(rng.integers(4, 19)),
                  temperature=0.0 if i % 3 else 0.9, seed=10 + i,
                  ignore_eos=True) for i in range(n)]


def _engine(spec, num_pages=10, max_slots=3, **kw):
  return Engine(ts.runtime("tiny1"), EngineConfig(
      max_slots=max_slots, num_pages=num_pages, max_context=48, page_size=8,
      prefill_chunk=16, min_chunk=8, cache_spec=spec, **kw))


def _alone(request, spec):
  return list(generate(ts.runtime("tiny1"), None, list(request.prompt),
                       request.max_new_tokens,
                       temperature=request.temperature, seed=request.seed,
                       eos_id=-1, cache_spec=spec, capacity=48).new_ids)


@pytest.mark.parametrize("name", ["dense", "int4_g8_sym", "kivi_pc8_r8",
                                  "pre_rope_hadamard_sinks"])
def test_engine_equals_generate_one_by_one(name):
  spec = None if name == "dense" else ts.SWEEP[name][1]
  engine = _engine(spec)
  requests = _requests()
  results = engine.run(requests)
  assert engine.preemptions > 0  # 9 pages of 8 tokens for 3 slots.
  assert max(s.running for s in engine.steps) == 3
  for request, result in zip(requests, results):
    assert result.new_ids == _alone(request, spec), request.id
    assert result.finish_reason == "length"
    assert len(result.token_times) == request.max_new_tokens


def test_engine_with_a_sliding_window_layer_equals_generate():
  # Layer 0 attends to its last 8 tokens (Gemma 3's local layers): its
  # ring buffer stays per slot, layer 1's storage is paged.
  config = dataclasses.replace(ts.TINY2, sliding_window=8, local_layers=(0,))
  runtime = Runtime(decoder_from_params(config, random_params(
      config, seed=5, scale=0.1)))
  spec = ts.SWEEP["int4_g8_sym"][1]
  engine = Engine(runtime, EngineConfig(
      max_slots=3, num_pages=10, max_context=48, page_size=8,
      prefill_chunk=16, min_chunk=8, cache_spec=spec))
  requests = _requests()
  results = engine.run(requests)
  assert engine.preemptions > 0
  for request, result in zip(requests, results):
    want = generate(runtime, None, list(request.prompt),
                    request.max_new_tokens, temperature=request.temperature,
                    seed=request.seed, eos_id=-1, cache_spec=spec,
                    capacity=48).new_ids
    assert result.new_ids == list(want), request.id


def test_engine_is_deterministic():
  requests = _requests(seed=1)
  first, second = _engine(None), _engine(None)
  a, b = first.run(requests), second.run(requests)
  assert [r.new_ids for r in a] == [r.new_ids for r in b]
  assert ([(s.running, s.decoding, s.prefill_tokens, s.pages_used)
           for s in first.steps]
          == [(s.running, s.decoding, s.prefill_tokens, s.pages_used)
              for s in second.steps])
  assert first.preemptions == second.preemptions


class _Letters:
  """A tokenizer stand-in: token t is the letter 'a' + t % 26."""

  def decode(self, ids):
    return "".join(chr(97 + t % 26) for t in ids)


def test_stops_at_eos_and_at_a_stop_string():
  base = _requests(2)[1]  # greedy
  want = _alone(base, None)
  eos = Request("eos", base.prompt, base.max_new_tokens, eos_id=want[2])
  text = _Letters().decode(want)
  stop = Request("stop", base.prompt, base.max_new_tokens, stop=(text[3:5],),
                 ignore_eos=True)
  engine = Engine(ts.runtime("tiny1"), EngineConfig(
      max_slots=2, num_pages=12, max_context=48, page_size=8,
      prefill_chunk=16, min_chunk=8), tokenizer=_Letters())
  r_eos, r_stop = engine.run([eos, stop])
  first_eos = want.index(want[2])
  assert r_eos.finish_reason == "eos" and r_eos.new_ids == want[:first_eos + 1]
  assert r_stop.finish_reason == "stop"
  assert text[3:5] in _Letters().decode(r_stop.new_ids)
  assert r_stop.new_ids == want[:len(r_stop.new_ids)]


@pytest.mark.parametrize("max_slots", [1, 4])
def test_prefix_caching_reuses_pages_and_changes_nothing(max_slots):
  """One slot: each request finds the previous one's pages. Four slots:
  all arrive and fit at once, and the last three wait for the first one's
  prefix to be committed instead of computing it again."""
  rng = np.random.default_rng(4)
  prefix = tuple(int(t) for t in rng.integers(0, 97, 24))
  requests = [Request(i, prefix + tuple(int(t) for t in rng.integers(
      0, 97, 5)), 6, ignore_eos=True) for i in range(4)]
  spec = ts.SWEEP["int4_g8_sym"][1]
  plain, cached = (_engine(spec, num_pages=30, max_slots=max_slots,
                           prefix_caching=pc) for pc in (False, True))
  want = plain.run(requests)
  got = cached.run(requests)
  assert [r.new_ids for r in got] == [r.new_ids for r in want]
  # The first request fills the index; later ones reuse 3 full pages.
  assert [r.reused_tokens for r in got] == [0, 24, 24, 24]
  assert (sum(s.prefill_tokens for s in cached.steps)
          == sum(s.prefill_tokens for s in plain.steps) - 3 * 24)
  assert max(s.running for s in plain.steps) == max_slots


def test_prefix_caching_is_refused_with_full_precision_windows():
  with pytest.raises(ValueError, match="keeps full-precision tokens"):
    _engine(ts.SWEEP["kivi_pc8_r8"][1], prefix_caching=True)


def test_bad_input_fails_before_compiling():
  engine = _engine(None, num_pages=4)
  with pytest.raises(ValueError, match="at least one request's pages"):
    engine.check([Request(0, tuple(range(20)), 20)])
  with pytest.raises(ValueError, match="> max_context 48"):
    engine.check([Request(0, tuple(range(40)), 9)])
  with pytest.raises(ValueError, match="appears twice"):
    engine.check([Request(0, (1,), 1), Request(0, (2,), 1)])
  with pytest.raises(ValueError, match="no tokenizer"):
    engine.check([Request(0, (1,), 1, stop=("x",))])
  with pytest.raises(ValueError, match="max_new_tokens=0"):
    Request(0, (1,), 0)
  with pytest.raises(ValueError, match="max_context=1000000: 1000000 tokens "
                     "exceed the model's max_position_embeddings"):
    Engine(ts.runtime("tiny1"), EngineConfig(
        max_slots=1, num_pages=4, max_context=10 ** 6))
  with pytest.raises(ValueError, match="power of two"):
    EngineConfig(max_slots=1, num_pages=4, max_context=8, prefill_chunk=24)
  with pytest.raises(ValueError, match="poisson:RATE"):
    parse_arrival("poisson:-2")
  with pytest.raises(ValueError, match="shared_prefix_len"):
    Workload(4, 16, 8, shared_prefix_len=16)


def test_workload_is_seeded_and_shares_its_prefix():
  ids = np.arange(1000) % 97
  w = Workload(5, 40, 10, lengths="uniform", arrival="poisson:2",
               shared_prefix_len=8, seed=3)
  a, b = make_requests(w, ids), make_requests(w, ids)
  assert a == b
  assert all(r.prompt[:8] == tuple(range(8)) for r in a)
  assert all(20 <= len(r.prompt) <= 60 and 5 <= r.max_new_tokens <= 15
             for r in a)
  arrivals = [r.arrival for r in a]
  assert arrivals == sorted(arrivals) and arrivals[0] > 0
