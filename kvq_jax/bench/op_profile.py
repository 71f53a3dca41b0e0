"""Where one layer's decode step spends its time, operation by operation.

`experiments.profile_ops` runs layer 0's one-token `attend` (the step
`experiments.bench_attention` times, `attention_bench.layer_step`) under
`jax.profiler.trace`, reads the trace's complete events back and sums
them per operation of the compiled module, per step. Each row also says
whether XLA:CPU splits the operation across threads (its
`outer_dimension_partitions` backend config, set by XLA's parallel task
assignment): a split operation waits for the other threads, which on a
small block can cost more than the work (WORKSPACE.md, "Operations split
across threads").

Times are from the profiler's events, so they include its overhead; they
rank operations and compare kinds in one run, they are not step timings
(`bench_attention` / `bench_decode` are).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import pathlib
import re
import tempfile
from typing import Iterable, Mapping

import jax
import jax.numpy as jnp

from kvq_jax.bench.attention_bench import layer_step
from kvq_jax.bench.decode_speed import equal_slots
from kvq_jax.models.config import ModelConfig
from kvq_jax.settings.kinds import resolve_kind

# "%name = shape opcode(": a shape is an array ("f32[3,64]{1,0}") or a
# tuple of them ("(f32[2]{0}, /*index=1*/s32[])", multi-output fusions).
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%([\w.\-]+) = (\([^()]*\)|\S+) ([a-z][\w\-]*)\(")
_SPLIT = re.compile(r'"outer_dimension_partitions":\[\s*"')
# Operations whose events enclose their nested computations' events.
_ENCLOSING = ("while", "conditional", "call")


@dataclasses.dataclass(frozen=True)
class OpRow:
  """One operation of a kind's compiled step: microseconds and calls per
  step in the trace, its result shape, whether XLA splits it."""

  kind: str
  context: int
  batch: int
  op: str
  shape: str
  us_per_step: float
  calls_per_step: float
  split: bool


def module_ops(hlo_text: str) -> dict[str, tuple[str, bool]]:
  """{instruction name: (result shape, split across threads)} of the
  compiled module's text, without control flow (while, conditional,
  call), whose events contain their bodies' operations."""
  ops = {}
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if m and m.group(3) not in _ENCLOSING:
      ops[m.group(1)] = (m.group(2), bool(_SPLIT.search(line)))
  return ops


def op_totals(events: Iterable[Mapping], names: Iterable[str],
              steps: int) -> dict[str, tuple[float, float]]:
  """{name: (microseconds per step, calls per step)} of the complete
  events ('ph' == 'X', 'dur' in microseconds) whose name is in `names`,
  over `steps` steps."""
  if steps < 1:
    raise ValueError(f"op_totals: steps={steps}; allowed: >= 1.")
  wanted = set(names)
  dur, calls = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("name") in wanted:
      dur[e["name"]] += float(e.get("dur", 0.0))
      calls[e["name"]] += 1
  return {n: (dur[n] / steps, calls[n] / steps) for n in dur}


def trace_events(directory: pathlib.Path) -> list[dict]:
  """The events of the Perfetto trace `jax.profiler.trace` wrote under
  `directory` (create_perfetto_trace=True)."""
  paths = sorted(directory.rglob("*.trace.json.gz"))
  if not paths:
    raise FileNotFoundError(f"no *.trace.json.gz under {directory}")
  with gzip.open(paths[-1], "rt", encoding="utf-8") as f:
    trace = json.load(f)
  return trace["traceEvents"] if isinstance(trace, dict) else trace


def profile_layer(config: ModelConfig, kind: str, context: int,
                  batch_size: int, steps: int, slots: int | None = None
                  ) -> list[OpRow]:
  """Rows of `kind`'s one-token attend at `context`, slowest first."""
  resolved = resolve_kind(kind)
  spec, dtype = resolved.spec, jnp.dtype(resolved.dtype)
  slots = equal_slots(context, [spec]) if slots is None else slots
  compiled, cache = layer_step(config, spec, dtype, batch_size, context,
                               slots, calls=steps + 1)
  out, cache = compiled(cache)  # Warm-up, outside the trace.
  jax.block_until_ready(out)
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      for _ in range(steps):
        out, cache = compiled(cache)
        jax.block_until_ready((out, cache))
    events = trace_events(pathlib.Path(tmp))
  ops = module_ops(compiled.as_text())
  totals = op_totals(events, ops, steps)
  rows = [OpRow(kind=kind, context=context, batch=batch_size, op=name,
                shape=ops[name][0], us_per_step=us, calls_per_step=calls,
                split=ops[name][1])
          for name, (us, calls) in totals.items()]
  return sorted(rows, key=lambda r: -r.us_per_step)


def summary(rows: list[OpRow]) -> dict[str, float]:
  """Operation time per step, and the part and count of split ones."""
  total = sum(r.us_per_step for r in rows)
  split = [r for r in rows if r.split]
  return {"us_per_step": total,
          "split_us_per_step": sum(r.us_per_step for r in split),
          "split_ops": len(split),
          "split_calls_per_step": sum(r.calls_per_step for r in split)}


def format_rows(rows: list[OpRow], top: int) -> str:
  """A markdown table of the `top` slowest operations."""
  lines = ["| op | shape | us/step | calls/step | split |",
           "|---|---|---:|---:|---|"]
  for r in rows[:top]:
    lines.append(f"| {r.op} | {r.shape} | {r.us_per_step:.1f} "
                 f"| {r.calls_per_step:g} | {'yes' if r.split else ''} |")
  return "\n".join(lines)
