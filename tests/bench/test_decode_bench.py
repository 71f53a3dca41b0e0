"""Decode-step benchmark rows (`bench.decode_bench`; kinds by
`settings.kinds`)."""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import pytest

from kvq_jax.bench import attention_bench
from kvq_jax.bench import decode_bench
from kvq_jax.capacity.memory import effective_bits
from kvq_jax.models.params import decoder_from_params, random_params
from kvq_jax.models.runtime import Runtime
from kvq_jax.settings.kinds import Kind, resolve_kind
from tests.models.tiny import TINY as _TINY

TINY = dataclasses.replace(_TINY, head_dim=32)  # q4_0's groups of 32 fit.


def test_rows_share_slots_and_carry_what_was_measured():
  runtime = Runtime(decoder_from_params(TINY, random_params(TINY)))
  kinds = ("bf16", "float32", "int8", "q4_0")
  rows = decode_bench.run(runtime, kinds, [24], batch_size=2, repeats=2,
                          log=lambda _: None)
  assert [r.kind for r in rows] == list(kinds)
  # int8 / q4_0 presets allocate whole blocks: every kind gets those slots.
  assert len({r.slots for r in rows}) == 1 and rows[0].slots >= 24
  for r in rows:
    kind = resolve_kind(r.kind)
    assert r.effective_bits == effective_bits(TINY, kind.spec,
                                              jnp.dtype(kind.dtype), 24)
    assert 0 < r.seconds_min <= r.seconds_median and r.batch == 2
  by_kind = {r.kind: r for r in rows}
  lengths = TINY.num_layers * 2 * 4  # int32 length_B per layer.
  assert (by_kind["bf16"].cache_bytes - lengths) * 2 == (
      by_kind["float32"].cache_bytes - lengths)
  fastest = min((by_kind["bf16"], by_kind["float32"]),
                key=lambda r: r.seconds_median)
  assert decode_bench.fastest_full_precision(rows)[(24, 2)] == fastest
  table = decode_bench.format_table(rows)
  assert table.count("\n") == len(rows) + 1 and f"| {fastest.kind} |" in table
  assert json.loads(json.dumps(decode_bench.rows_json(rows)))[2]["kind"] == (
      "int8")


def test_kinds_resolve_to_the_presets_cache():
  assert resolve_kind("bf16") == Kind("bf16", None, "bfloat16")
  spec = resolve_kind("q4_0").spec
  assert spec.k.format == "int4" and spec.k.group_size == 32
  with pytest.raises(ValueError, match="'int7' is unknown; allowed: bf16, "
                     "float32, .* a preset"):
    resolve_kind("int7")


def test_attention_rows_time_the_caches_own_decode_path():
  """One layer's attend of one token: dense kinds once, quantized kinds
  per implementation (pallas interpreted here), same slots for all."""
  rows = attention_bench.run(TINY, ("float32", "int8"), [40], batch_size=2,
                             repeats=2, implementations=("xla", "pallas"),
                             log=lambda _: None)
  assert [r.kind for r in rows] == ["float32", "int8", "int8:pallas"]
  assert len({r.slots for r in rows}) == 1
  kind = resolve_kind("int8")
  assert rows[1].effective_bits == effective_bits(
      TINY, kind.spec, jnp.dtype(kind.dtype), 40)
  # One layer's cache: int8 codes + a scale per head vector vs float32.
  assert rows[1].cache_bytes < 0.4 * rows[0].cache_bytes
  with pytest.raises(ValueError, match="implementation"):
    attention_bench.run(TINY, ("int8",), [40], batch_size=1, repeats=1,
                        implementations=("triton",))


def test_rounds_time_every_kind_in_turn_with_paired_ratios():
  """rounds=2: one row per kind with each round's median; the table's
  per-round range pairs each round with the same round's fastest
  full-precision step."""
  runtime = Runtime(decoder_from_params(TINY, random_params(TINY)))
  logged = []
  rows = decode_bench.run(runtime, ("float32", "int8"), [24], batch_size=1,
                          repeats=2, rounds=2, log=logged.append)
  assert [r.kind for r in rows] == ["float32", "int8"]
  assert [line.split(":")[0] for line in logged] == [
      "  round 1/2", "  round 1/2", "  round 2/2", "  round 2/2"]
  for r in rows:
    assert len(r.round_seconds) == 2
    assert r.seconds_median == pytest.approx(sum(r.round_seconds) / 2)
    assert 0 < r.seconds_min <= min(r.round_seconds)
  made_up = dataclasses.replace(rows[1], round_seconds=(3.0, 1.0))
  base = dataclasses.replace(rows[0], round_seconds=(2.0, 2.0),
                             seconds_median=2.0)
  assert decode_bench.round_ratios(made_up, base) == [1.5, 0.5]
  table = decode_bench.format_table([base, made_up])
  assert "per-round x time" in table and "| 0.500-1.500 |" in table
  assert "| 1.000-1.000 |" in table
  with pytest.raises(ValueError, match="rounds=0"):
    decode_bench.run(runtime, ("float32",), [24], batch_size=1, repeats=2,
                     rounds=0)
