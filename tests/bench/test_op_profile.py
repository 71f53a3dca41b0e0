"""Per-operation decode-step profile (`bench.op_profile`)."""

from __future__ import annotations

import dataclasses

import pytest

from kvq_jax.bench import op_profile
from tests.models.tiny import TINY as _TINY

TINY = dataclasses.replace(_TINY, head_dim=32)

_HLO = """\
%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %fusion.1 = f32[3,256,16]{2,1,0} fusion(%a, %b), kind=kLoop, calls=%f1, backend_config={"outer_dimension_partitions":["2"]}
  %ynn_fusion = f32[3,3,16]{2,1,0} fusion(%c), kind=kCustom, calls=%f2, backend_config={"outer_dimension_partitions":[],"fusion_config":{}}
}
ENTRY %main (x: f32[4]) -> f32[4] {
  %while.3 = (s32[], f32[4]) while(%t), condition=%cond, body=%body
  %fusion.2 = (f32[4]{0}, /*index=1*/s32[]) fusion(%x), kind=kLoop, calls=%f3
  ROOT %copy.7 = f32[4]{0} copy(%g)
}
"""


def test_module_ops_names_shapes_and_threads_split():
  ops = op_profile.module_ops(_HLO)
  assert ops == {"fusion.1": ("f32[3,256,16]{2,1,0}", True),
                 "ynn_fusion": ("f32[3,3,16]{2,1,0}", False),
                 "fusion.2": ("(f32[4]{0}, /*index=1*/s32[])", False),
                 "copy.7": ("f32[4]{0}", False)}  # No while: it nests.


def test_op_totals_sum_complete_events_of_module_ops_per_step():
  events = [
      {"ph": "X", "name": "fusion.1", "dur": 30.0},
      {"ph": "X", "name": "fusion.1", "dur": 50.0},
      {"ph": "X", "name": "copy.7", "dur": 4.0},
      {"ph": "X", "name": "while.3", "dur": 900.0},  # Not asked for.
      {"ph": "i", "name": "fusion.1"},  # Not a complete event.
      {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 1000.0},
  ]
  assert op_profile.op_totals(events, ["fusion.1", "copy.7"], steps=2) == {
      "fusion.1": (40.0, 1.0), "copy.7": (2.0, 0.5)}
  with pytest.raises(ValueError, match="steps=0"):
    op_profile.op_totals(events, ["fusion.1"], steps=0)


def test_summary_and_table_split_part():
  row = lambda op, us, split: op_profile.OpRow(
      kind="q4_0", context=64, batch=1, op=op, shape="f32[2]", us_per_step=us,
      calls_per_step=2.0, split=split)
  rows = [row("a", 30.0, True), row("b", 10.0, False), row("c", 5.0, True)]
  assert op_profile.summary(rows) == {
      "us_per_step": 45.0, "split_us_per_step": 35.0, "split_ops": 2,
      "split_calls_per_step": 4.0}
  table = op_profile.format_rows(rows, top=2)
  assert table.splitlines()[2:] == ["| a | f32[2] | 30.0 | 2 | yes |",
                                    "| b | f32[2] | 10.0 | 2 |  |"]


def test_profile_layer_reads_the_traced_steps_back():
  """A real trace of a tiny layer: rows are operations of the compiled
  step with time and calls in every traced step, slowest first."""
  rows = op_profile.profile_layer(TINY, "int8", context=40, batch_size=1,
                                  steps=2, slots=48)
  assert rows and all(r.kind == "int8" and r.context == 40 for r in rows)
  assert [r.us_per_step for r in rows] == sorted(
      (r.us_per_step for r in rows), reverse=True)
  assert all(r.us_per_step > 0 and r.calls_per_step > 0 for r in rows)
