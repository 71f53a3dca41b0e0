r"""Per-layer K/V formats under a bits/element budget from a sensitivity table.

  python -m experiments.allocate \
      --sensitivity=runs/sensitivity_int4_g32/sensitivity.json[,MORE.json] \
      --budget=4.0 [--k_formats=fp,int8,int4_g32,int2_g32_asym] \
      [--v_formats=...] [--metric=delta_ppl|kl_mean] [--workdir=DIR]

Writes DIR/allocated_<budget>.py (a preset: predicted damage in its
docstring) and prints the allocation; verify the prediction with
  python -m experiments.run --config=DIR/allocated_<budget>.py
Costs are effective bits at the table's window length (sinks, residual and
per-channel windows charged in the window dtype, and each format's
per-layer constants: calibrated levels, the key affine, a share of a
fixed codebook, --nocharge_constants to leave them out; tables written
before that field existed fall back to stored bits, and say so). Candidates other
than fp must have been measured by
experiments.layer_sensitivity (the preset's format and its --formats);
several tables of the same model and windows are merged (e.g. an int4_g32
sweep beside an int2_g32_asym one).
"""

import pathlib

from absl import app
from absl import flags

from kvq_jax.cli import log_setup
from kvq_jax.cli.entry import run_main
from kvq_jax.facade import model_config
from kvq_jax.research import allocator
from kvq_jax.research import format_constants
from kvq_jax.research import preset_writer
from kvq_jax.research.sensitivity_table import load_json, merge_tables

_SENSITIVITY = flags.DEFINE_list(
    "sensitivity", None, "sensitivity.json from experiments.layer_sensitivity "
    "(comma-separated: several, same model and windows)", required=True)
_BUDGET = flags.DEFINE_float("budget", None, "mean bits per K/V element",
                             required=True)
_K_FORMATS = flags.DEFINE_list(
    "k_formats", None, "K candidates (short names; default: fp and every "
    "measured format)")
_V_FORMATS = flags.DEFINE_list("v_formats", None, "V candidates (as K)")
_METRIC = flags.DEFINE_enum("metric", "delta_ppl", allocator.DAMAGE_METRICS,
                            "damage measure to minimise")
_CONSTANTS = flags.DEFINE_bool(
    "charge_constants", True, "add each format's per-layer constants "
    "(calibrated levels, key affine, a share of a fixed codebook) at the "
    "table's context, as capacity.memory charges them")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "where the preset goes (default: beside the table)")


def _mean_over_layers(constants: dict) -> dict:
  sums = {}
  for (tensor, _, fmt), bits in constants.items():
    sums.setdefault((tensor, fmt), []).append(bits)
  return {key: sum(v) / len(v) for key, v in sums.items()}


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  paths = _SENSITIVITY.value
  table = merge_tables([load_json(p) for p in paths], paths)
  meta = table["meta"]
  default = [allocator.FULL_PRECISION] + list(meta["formats"])
  slots = meta.get("full_precision_slots")
  slots = allocator.FullPrecisionSlots(**slots) if slots else None
  print("costs: " + (f"effective bits at {slots.context} tokens" if slots
                     else "stored bits (the table predates "
                     "full_precision_slots; sinks and windows not charged)"))
  k_formats = _K_FORMATS.value or default
  v_formats = _V_FORMATS.value or default
  constants = tables = None
  if slots and _CONSTANTS.value:
    constants, tables = format_constants.table_constant_bits(
        meta, model_config(meta["model"]), k_formats, v_formats)
    print("per-layer constants charged (mean over layers, bits/element): "
          + ", ".join(f"{t} {f} {v:.4f}" for (t, f), v in
                      _mean_over_layers(constants).items()))
    print("fixed codebooks, once per model (bits on the mean): "
          + (", ".join(f"{f} {b:.4f}" for f, (_, b) in tables.items())
             or "none"))
  allocation = allocator.allocate(
      allocator.damage_table(table, _METRIC.value), meta["num_layers"],
      k_formats, v_formats, _BUDGET.value, head_dim=meta["head_dim"],
      fp_bits=meta["fp_bits"], metric=_METRIC.value, slots=slots,
      constant_bits=constants, fixed_tables=tables)
  workdir = pathlib.Path(_WORKDIR.value or pathlib.Path(paths[0]).parent)
  path = preset_writer.write_preset(
      workdir / f"allocated_{_BUDGET.value:g}.py", allocation, table,
      ",".join(paths))
  print(f"budget {allocation.budget:g} bits/element, achieved "
        f"{allocation.mean_bits:.4f}; predicted {allocation.metric} "
        f"{allocation.predicted_damage:+.6g}")
  for i, (k, v) in enumerate(allocation.layer_pairs()):
    print(f"  layer {i:2d}: K {k:16s} V {v}")
  print(f"wrote {path}\nverify: python -m experiments.run --config={path}")


if __name__ == "__main__":
  run_main(main)
