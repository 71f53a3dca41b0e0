"""The allocator on synthetic tables, and its preset through the settings."""

from __future__ import annotations

import pytest

from kvq_jax.cli import config_flag
from kvq_jax.research import allocator
from kvq_jax.research import preset_writer
from kvq_jax.research import sensitivity_table
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.short_specs import parse_short_spec

H, FP = 64, 32
FORMATS = ("int8", "int4_g32", "int2_g32_asym")
BITS = {"fp": 32.0, "int8": 8.25, "int4_g32": 4.5, "int2_g32_asym": 3.0}


def synthetic(num_layers: int, sensitive: set[int]) -> dict:
  """Damage grows as bits shrink; `sensitive` layers are 100x worse."""
  base = {"int8": 0.001, "int4_g32": 0.01, "int2_g32_asym": 0.1}
  return {(t, i, f): base[f] * (100.0 if i in sensitive else 1.0)
          for t in ("K", "V") for i in range(num_layers) for f in FORMATS}


def mean_bits(a: allocator.Allocation) -> float:
  formats = a.k_formats + a.v_formats
  return sum(BITS[f] for f in formats) / len(formats)


def test_format_bits():
  assert allocator.format_bits("int8", H, FP) == 8.25  # per_token over H.
  assert allocator.format_bits("int4_g32", H, FP) == 4.5
  assert allocator.format_bits("int2_g32_asym", H, FP) == 3.0
  assert allocator.format_bits("fp", H, FP) == 32.0


def test_format_bits_charge_full_precision_slots():
  """Effective bits at 512 tokens, counted by hand: int2_pc32_asym stores
  2 + 32/32 bits and keeps 31 bfloat16 keys in its window; one sink."""
  slots = allocator.FullPrecisionSlots(context=512)
  assert allocator.format_bits("int2_pc32_asym", H, FP) == 3.0
  assert allocator.format_bits("int2_pc32_asym", H, FP, slots) == (
      3.0 * 481 + 31 * 16) / 512
  assert allocator.format_bits("int4_g32", H, FP, slots) == 4.5
  sink = allocator.FullPrecisionSlots(context=512, sink=1, residual=2)
  assert allocator.format_bits("int4_g32", H, FP, sink) == (
      4.5 * 509 + 3 * 16) / 512
  assert allocator.format_bits("fp", H, FP, sink) == 32.0
  flush = allocator.FullPrecisionSlots(context=512, flush_block=64)
  assert flush.slots("int2_pc32_asym") == flush.slots("int8") == 63


def test_charged_windows_change_the_choice():
  """At 3.3 bits per-channel int2 fits on stored bits (3.0) but not once
  its 31 window tokens are charged (3.79; with the other tensor at 3.0 the
  mean is 3.39): then both take int2_g32_asym."""
  damage = {(t, 0, f): d for t in ("K", "V") for f, d in (
      ("int2_pc32_asym", 0.1), ("int2_g32_asym", 0.5), ("int4_g32", 0.01))}
  cands = ("int2_pc32_asym", "int2_g32_asym", "int4_g32")
  stored = allocator.allocate(damage, 1, cands, cands, 3.3, head_dim=H,
                              fp_bits=FP)
  charged = allocator.allocate(
      damage, 1, cands, cands, 3.3, head_dim=H, fp_bits=FP,
      slots=allocator.FullPrecisionSlots(context=512))
  assert stored.k_formats == stored.v_formats == ("int2_pc32_asym",)
  assert charged.k_formats == charged.v_formats == ("int2_g32_asym",)
  assert charged.mean_bits == 3.0


@pytest.mark.parametrize("budget", [3.0, 3.4, 4.5, 5.0, 6.3, 8.25, 12.0])
def test_meets_the_budget(budget):
  candidates = ("fp",) + FORMATS
  a = allocator.allocate(synthetic(6, {1}), 6, candidates, candidates,
                         budget, head_dim=H, fp_bits=FP)
  assert a.mean_bits == pytest.approx(mean_bits(a))
  assert a.mean_bits <= budget + 1e-12
  assert len(a.k_formats) == len(a.v_formats) == 6


def test_exact_optimum_against_brute_force():
  import itertools
  damage = synthetic(2, {0})
  damage[("V", 1, "int4_g32")] = 0.5  # An irregular tensor.
  cands = ("fp",) + FORMATS
  best = None
  for combo in itertools.product(cands, repeat=4):
    bits = sum(BITS[f] for f in combo) / 4
    if bits > 7.0:
      continue
    d = sum(0.0 if f == "fp" else damage[(t, i, f)]
            for (t, i), f in zip([("K", 0), ("K", 1), ("V", 0), ("V", 1)],
                                 combo))
    best = d if best is None else min(best, d)
  a = allocator.allocate(damage, 2, cands, cands, 7.0, head_dim=H,
                         fp_bits=FP)
  assert a.predicted_damage == pytest.approx(best)


def test_prefers_cheap_formats_on_insensitive_layers():
  a = allocator.allocate(synthetic(8, {2, 5}), 8, FORMATS, FORMATS, 4.5,
                         head_dim=H, fp_bits=FP)
  for layer in (2, 5):
    assert a.k_formats[layer] == "int8" and a.v_formats[layer] == "int8"
  cheap = [f for i, f in enumerate(a.k_formats + a.v_formats)
           if i % 8 not in (2, 5)]
  assert "int2_g32_asym" in cheap and "int8" not in cheap


def test_ties_take_the_cheapest():
  damage = {(t, i, f): 0.0 for t in ("K", "V") for i in range(3)
            for f in FORMATS}
  a = allocator.allocate(damage, 3, ("fp",) + FORMATS, ("fp",) + FORMATS,
                         32.0, head_dim=H, fp_bits=FP)
  assert set(a.k_formats + a.v_formats) == {"int2_g32_asym"}


def test_errors():
  damage = synthetic(2, set())
  with pytest.raises(ValueError, match="below the cheapest"):
    allocator.allocate(damage, 2, FORMATS, FORMATS, 2.9, head_dim=H,
                       fp_bits=FP)
  with pytest.raises(ValueError, match="int4_g32_asym"):
    allocator.allocate(damage, 2, ("int4_g32_asym",), FORMATS, 8.0,
                       head_dim=H, fp_bits=FP)
  with pytest.raises(ValueError, match="metric"):
    allocator.damage_table({"rows": []}, "ppl")


def test_damage_table_reads_only_rows():
  rows = [
      {"mode": "only", "tensor": "K", "layer": 0, "k_format": "int8",
       "v_format": "fp", "delta_ppl": 0.1, "kl_mean": 0.01},
      {"mode": "only", "tensor": "V", "layer": 0, "k_format": "fp",
       "v_format": "int8", "delta_ppl": 0.2, "kl_mean": 0.02},
      {"mode": "only", "tensor": "KV", "layer": 0, "k_format": "int8",
       "v_format": "int8", "delta_ppl": 0.3, "kl_mean": 0.03},
      {"mode": "all_but_one", "tensor": "KV", "layer": 0, "k_format": "base",
       "v_format": "base", "delta_ppl": 0.4, "kl_mean": 0.04},
  ]
  assert allocator.damage_table({"rows": rows}, "kl_mean") == {
      ("K", 0, "int8"): 0.01, ("V", 0, "int8"): 0.02}


def test_written_preset_loads_through_the_settings(tmp_path):
  a = allocator.allocate(synthetic(4, {3}), 4, ("fp",) + FORMATS,
                         ("fp",) + FORMATS, 5.0, head_dim=H, fp_bits=FP)
  config = config_flag._PresetParser(name="config").parse("int4_g32")  # pylint: disable=protected-access
  config.cache.key_affine_dtype = "float16"  # Copied: what was probed.
  table = {"meta": {"preset": "int4_g32", "model": "smollm2-135m",
                    "config": config.to_dict()},
           "baseline": {"num_windows": 4, "window_len": 512,
                        "ppl_baseline": 10.0}}
  path = preset_writer.write_preset(tmp_path / "allocated_5.py", a, table,
                                    "sensitivity.json")
  source = path.read_text()
  assert f"{a.predicted_damage:+.6g}" in source
  assert "python -m experiments.run --config=" in source
  loaded = config_flag._PresetParser(name="config").parse(str(path))  # pylint: disable=protected-access
  spec = settings_from_config(loaded).cache_spec
  for i in range(4):
    layer = spec.layer(i)
    for got, want in ((layer.k, a.k_formats[i]), (layer.v, a.v_formats[i])):
      expected = parse_short_spec(want)
      assert (got is None) == (expected is None)
      if expected is not None:
        assert got.format == expected.format
        assert got.scheme == expected.scheme
        assert got.granularity == expected.granularity
        assert got.group_size == expected.group_size
  assert loaded.eval.num_windows == config.eval.num_windows
  assert loaded.cache.key_affine_dtype == "float16"
  assert loaded.made_for == "smollm2-135m"  # The probed model.


def _table(preset: str, fmt: str, damage: float, **baseline) -> dict:
  rows = [{"mode": "only", "tensor": t, "layer": 0,
           "k_format": fmt if t == "K" else "fp",
           "v_format": fmt if t == "V" else "fp",
           "delta_ppl": damage, "kl_mean": damage / 10} for t in ("K", "V")]
  meta = {"preset": preset, "model": "m", "eval_data": "text", "scoring":
          "second_half", "num_layers": 1, "head_dim": H, "cache_dtype":
          "float32", "fp_bits": FP, "formats": [fmt], "extra_formats": []}
  base = {"num_windows": 8, "window_len": 512, "ppl_baseline": 10.0}
  base.update(baseline)
  return {"meta": meta, "baseline": base, "rows": rows}


def test_merged_tables_offer_every_format():
  tables = [_table("int4_g32", "int4_g32", 0.5),
            _table("int2_g32_asym", "int2_g32_asym", 3.0)]
  merged = sensitivity_table.merge_tables(tables, ["a.json", "b.json"])
  assert merged["meta"]["preset"] == "int4_g32+int2_g32_asym"
  assert merged["meta"]["formats"] == ["int2_g32_asym", "int4_g32"]
  damage = allocator.damage_table(merged, "kl_mean")
  assert damage == {("K", 0, "int4_g32"): 0.05, ("V", 0, "int4_g32"): 0.05,
                    ("K", 0, "int2_g32_asym"): 0.3,
                    ("V", 0, "int2_g32_asym"): 0.3}
  a = allocator.allocate(damage, 1, FORMATS[1:], FORMATS[1:], 4.5,
                         head_dim=H, fp_bits=FP)
  assert a.k_formats == ("int4_g32",) and a.v_formats == ("int4_g32",)


@pytest.mark.parametrize("change, match", [
    ({"window_len": 256}, "baseline.window_len"),
    ({"ppl_baseline": 10.1}, "baselines 10 and 10.1"),
])
def test_merging_tables_of_other_windows_fails(change, match):
  tables = [_table("a", "int8", 0.0), _table("b", "int4_g32", 0.1, **change)]
  with pytest.raises(ValueError, match=match):
    sensitivity_table.merge_tables(tables, ["a.json", "b.json"])
  other = _table("b", "int4_g32", 0.1)
  other["meta"]["model"] = "other"
  with pytest.raises(ValueError, match="meta.model"):
    sensitivity_table.merge_tables([tables[0], other], ["a.json", "b.json"])


def test_per_layer_constants_are_charged_and_change_the_choice():
  """Both tensors at 3.5: int4_g32 (4.5) on one and int2_g32_asym (3.0) on
  the other fits exactly, until int4_g32 is charged 0.25 bits of
  constants in layer 0: then int2_g32_asym on both (mean 3.0)."""
  damage = {(t, 0, f): d for t in ("K", "V") for f, d in (
      ("int2_g32_asym", 0.5), ("int4_g32", 0.01))}
  cands = ("int2_g32_asym", "int4_g32")
  free = allocator.allocate(damage, 1, cands, cands, 3.75, head_dim=H,
                            fp_bits=FP)
  assert sorted(free.k_formats + free.v_formats) == [
      "int2_g32_asym", "int4_g32"]
  constants = {(t, 0, f): 0.5 if f == "int4_g32" else 0.0
               for t in ("K", "V") for f in cands}
  charged = allocator.allocate(damage, 1, cands, cands, 3.75, head_dim=H,
                               fp_bits=FP, constant_bits=constants)
  assert charged.k_formats == charged.v_formats == ("int2_g32_asym",)
  assert charged.mean_bits == 3.0


def test_fixed_tables_are_paid_once_against_brute_force():
  """A fixed codebook costs its bits once if any tensor uses it: brute
  force over every assignment of 2 layers x {K, V}, with tables 'a'
  (int2_lm, 0.3 bits on the mean) and 'b' (int4_g32, 0.2)."""
  import itertools
  cands = ("int8", "int4_g32", "int2_lm")
  bits = {"int8": 8.25, "int4_g32": 4.5, "int2_lm": 2.25}
  tables = {"int2_lm": ("a", 0.3), "int4_g32": ("b", 0.2)}
  damage = {(t, i, f): {"int8": 0.001, "int4_g32": 0.02, "int2_lm": 0.3}[f]
            * (1 + i + (t == "V")) for t in ("K", "V") for i in range(2)
            for f in cands}
  slots = [("K", 0), ("K", 1), ("V", 0), ("V", 1)]
  for budget in (3.0, 4.0, 5.0, 6.0, 7.0):
    best = None
    for combo in itertools.product(cands, repeat=4):
      cost = sum(bits[f] for f in combo) / 4 + sum(
          b for key, b in {tables[f] for f in combo if f in tables})
      if cost <= budget + 1e-12:
        d = sum(damage[(t, i, f)] for (t, i), f in zip(slots, combo))
        best = d if best is None else min(best, d)
    a = allocator.allocate(damage, 2, cands, cands, budget, head_dim=H,
                           fp_bits=FP, fixed_tables=tables)
    assert a.predicted_damage == pytest.approx(best), budget
    used = {tables[f] for f in a.k_formats + a.v_formats if f in tables}
    assert a.mean_bits == pytest.approx(
        mean_bits_of(a, bits) + sum(b for _, b in used))
    assert a.mean_bits <= budget + 1e-9
  with pytest.raises(ValueError, match="below the cheapest"):
    allocator.allocate(damage, 2, cands, cands, 2.5, head_dim=H,
                       fp_bits=FP, fixed_tables=tables)


def mean_bits_of(a: allocator.Allocation, bits: dict) -> float:
  formats = a.k_formats + a.v_formats
  return sum(bits[f] for f in formats) / len(formats)


def test_too_many_cost_states_round_costs_up_instead_of_failing(
    monkeypatch):
  """Exact costs whose common denominator needs more DP states than
  MAX_STATES (Gemma 3's head_dim 256 with per-layer constants gave 12
  million): the costs are rounded up to a power-of-two grid, so the
  assignment still fits the budget on its exact costs, and it can only
  lose to the exact optimum (brute force over 3^4 assignments)."""
  import itertools
  cands = ("int8", "int4_g32", "int2_g32_asym")
  damage = {(t, i, f): {"int8": 0.001, "int4_g32": 0.02,
                        "int2_g32_asym": 0.3}[f] * (1 + i + (t == "V"))
            for t in ("K", "V") for i in range(2) for f in cands}
  constants = {(t, i, f): (37 * i + 11 * (t == "V") + 5 * len(f)) / 1024
               for t in ("K", "V") for i in range(2) for f in cands}
  slots = [("K", 0), ("K", 1), ("V", 0), ("V", 1)]

  def exact_cost(combo):
    return sum(BITS[f] + constants[(t, i, f)]
               for (t, i), f in zip(slots, combo)) / 4

  for budget in (4.0, 5.5, 7.0):
    best = min(sum(damage[(t, i, f)] for (t, i), f in zip(slots, combo))
               for combo in itertools.product(cands, repeat=4)
               if exact_cost(combo) <= budget)
    exact = allocator.allocate(damage, 2, cands, cands, budget, head_dim=H,
                               fp_bits=FP, constant_bits=constants)
    assert exact.predicted_damage == pytest.approx(best)
    with monkeypatch.context() as m:
      m.setattr(allocator, "MAX_STATES", 40)
      coarse = allocator.allocate(damage, 2, cands, cands, budget,
                                  head_dim=H, fp_bits=FP,
                                  constant_bits=constants)
    combo = coarse.k_formats + coarse.v_formats
    combo = (combo[0], combo[1], combo[2], combo[3])
    assert coarse.mean_bits == pytest.approx(exact_cost(combo))
    assert coarse.mean_bits <= budget
    assert coarse.predicted_damage >= best - 1e-12
