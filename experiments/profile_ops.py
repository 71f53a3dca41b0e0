r"""Per-operation profile of one layer's decode step, kind by kind.

  python -m experiments.profile_ops --kinds=bf16,int8,q4_0,kivi2,kvq4 \
      --context=1024 [--batch=1] [--steps=20] [--top=12] [--json=FILE]

Layer 0 of `--model`'s shapes, one-token `attend` (what bench_attention
times), run under the JAX profiler; every kind gets the same slots. Prints
the slowest operations and how much of the step XLA:CPU splits across
threads (`kvq_jax/bench/op_profile.py`).
"""

from __future__ import annotations

import dataclasses

from absl import app
from absl import flags

from kvq_jax import assets
from kvq_jax.bench import op_profile
from kvq_jax.bench.decode_speed import equal_slots
from kvq_jax.bench.kinds import DEFAULT_KINDS
from kvq_jax.bench.timing import machine_description, write_measured
from kvq_jax.cli import log_setup
from kvq_jax.cli.entry import run_main
from kvq_jax.facade import model_config
from kvq_jax.settings.kinds import resolve_kind

_KINDS = flags.DEFINE_list("kinds", list(DEFAULT_KINDS),
                           "bf16, float32, preset names or short specs.")
_CONTEXT = flags.DEFINE_integer("context", 1024, "Tokens held.")
_BATCH = flags.DEFINE_integer("batch", 1, "Sequences.")
_STEPS = flags.DEFINE_integer("steps", 20, "Traced steps (after a warm-up).")
_TOP = flags.DEFINE_integer("top", 12, "Operations printed per kind.")
_MODEL = flags.DEFINE_string("model", assets.DEFAULT_MODEL,
                             "registered name or checkpoint path (shapes)")
_JSON = flags.DEFINE_string("json", None, "Also write every row here.")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = model_config(_MODEL.value)
  print(machine_description())
  slots = equal_slots(_CONTEXT.value,
                      [resolve_kind(k).spec for k in _KINDS.value])
  out = []
  for kind in _KINDS.value:
    rows = op_profile.profile_layer(config, kind, _CONTEXT.value,
                                    _BATCH.value, _STEPS.value, slots)
    s = op_profile.summary(rows)
    print(f"\n{kind} @ {_CONTEXT.value}, B={_BATCH.value}, {slots} slots: "
          f"{s['us_per_step']:.0f} us/step in operations; split across "
          f"threads: {s['split_ops']} ops, {s['split_calls_per_step']:g} "
          f"calls, {s['split_us_per_step']:.0f} us/step")
    print(op_profile.format_rows(rows, _TOP.value))
    out.append({"summary": s, "rows": [dataclasses.asdict(r) for r in rows]})
  if _JSON.value:
    print(f"rows: {write_measured(_JSON.value, {'kinds': out})}")


if __name__ == "__main__":
  run_main(main)
