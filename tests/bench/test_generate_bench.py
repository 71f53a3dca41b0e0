"""End-to-end generation benchmark rows (`bench.generate_bench`)."""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import pytest

from kvq_jax.bench import generate_bench
from kvq_jax.bench.decode_bench import write_rows
from kvq_jax.capacity.memory import effective_bits
from kvq_jax.models.generate import generate
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.runtime import Runtime
from kvq_jax.settings.kinds import resolve_kind
from tests.models.tiny import TINY

KINDS = ("float32", "int8")
CONTEXTS = (32, 64)
NEW = 4


@pytest.fixture(scope="module")
def runtime():
  # Large enough weights that the greedy tokens change from step to step.
  return Runtime(decoder_from_params(TINY, random_params(TINY, seed=3,
                                                         scale=0.3)))


@pytest.fixture(scope="module")
def rows(runtime):
  return generate_bench.run(runtime, KINDS, CONTEXTS, batch_size=2,
                            new_tokens=NEW, log=lambda _: None)


def test_one_row_per_kind_and_context_with_what_was_measured(rows):
  assert [(r.context, r.kind) for r in rows] == [
      (c, k) for c in CONTEXTS for k in KINDS]
  for context in CONTEXTS:
    at = [r for r in rows if r.context == context]
    # Every kind of one context gets the same slots, >= prompt + new tokens.
    assert len({r.slots for r in at}) == 1 and at[0].slots >= context + NEW
  for r in rows:
    kind = resolve_kind(r.kind)
    assert r.effective_bits == effective_bits(TINY, kind.spec,
                                              jnp.dtype(kind.dtype),
                                              r.context + NEW)
    assert r.decode_tokens_per_s == pytest.approx(2 * (NEW - 1) / r.decode_seconds)
    assert r.decode_tokens_per_s > 0 and r.prefill_seconds > 0
    # The step holds at least the cache it reads, and the process its weights.
    assert r.decode_step_bytes > r.cache_bytes and r.peak_rss_gib > 0
    assert len(r.token_ids) == 2
    assert all(len(ids) == NEW + 1 for ids in r.token_ids)
  by_kind = {r.kind: r for r in rows if r.context == 64}
  assert by_kind["int8"].cache_bytes < 0.5 * by_kind["float32"].cache_bytes


def test_float32_tokens_equal_an_independent_greedy_decode(runtime, rows):
  context = CONTEXTS[-1]  # One context: generate compiles its own programs.
  prompts = generate_bench.random_prompts(TINY.vocab_size, 2, context)
  row = next(r for r in rows if r.kind == "float32" and r.context == context)
  for b in range(2):
    reference = generate(runtime, None, prompts[b].tolist(), NEW + 1,
                         eos_id=-1, cache_dtype=jnp.float32)
    assert row.token_ids[b] == reference.new_ids
    assert len(set(reference.new_ids)) > 1  # An off-by-one would show.


def test_table_and_json_compare_with_the_fastest_full_precision_kind(
    rows, tmp_path):
  # A faster bf16 row at the first context (made up: compiling a real one
  # would double the test's time) becomes the baseline there.
  f32 = rows[0]
  bf16 = dataclasses.replace(f32, kind="bf16",
                             decode_tokens_per_s=2 * f32.decode_tokens_per_s)
  rows = [bf16] + rows
  best = generate_bench.fastest_full_precision(rows)
  f32_later = next(r for r in rows
                   if r.kind == "float32" and r.context == CONTEXTS[1])
  assert best == {(CONTEXTS[0], 2): bf16, (CONTEXTS[1], 2): f32_later}
  table = generate_bench.format_table(rows)
  assert "| 0.500 |" in table  # float32's tokens/s ratio to bf16.
  assert table.count("\n") == len(rows) + 1
  path = write_rows(str(tmp_path / "rows.json"), "tiny", rows,
                    generate_bench.rows_json)
  written = json.loads(path.read_text())["rows"]
  fields = {f.name for f in dataclasses.fields(generate_bench.Row)}
  assert set(written[0]) == fields | {"baseline", "tokens_per_s_ratio",
                                      "cache_bytes_ratio"}
  for r, j in zip(rows, written):
    b = best[(r.context, r.batch)]
    assert j["baseline"] == b.kind
    assert j["tokens_per_s_ratio"] == pytest.approx(
        r.decode_tokens_per_s / b.decode_tokens_per_s)
    assert j["token_ids"] == [list(ids) for ids in r.token_ids]


def test_bad_arguments_say_what_is_allowed(runtime):
  with pytest.raises(ValueError, match="new_tokens=1; allowed: an int >= 2"):
    generate_bench.run(runtime, ("float32",), [8], batch_size=1,
                       new_tokens=1)
  with pytest.raises(ValueError, match="contexts=\\[\\]"):
    generate_bench.run(runtime, ("float32",), [], batch_size=1, new_tokens=2)
