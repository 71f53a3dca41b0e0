"""`experiments.compare`'s library call: one preset against another.

`run_compare(config, name, against, workdir)` is a sweep (`sweep.runner`)
with no grid and two points: the `--config` preset as given (its
`--config.*` overrides included) under `name`, and `against` (a preset
name, a preset file or a short spec, as `--points` takes it), paired on
the same windows (`sweep.pairs`: the per-window ΔNLL and KL differences,
clustered by window). Besides the sweep's own files it writes
workdir/compare.json: both points' rows (PPL, ΔPPL with its CI, KL,
effective bits), the paired differences, the verdict, and the
`experiments.run` command that evaluates each alone.
"""

from __future__ import annotations

import json
import pathlib
from typing import Sequence

import ml_collections

from kvq_jax.bench.timing import machine_description
from kvq_jax.eval.uncertainty_format import describe_delta_ci
from kvq_jax.sweep import pairs as sweep_pairs
from kvq_jax.sweep.runner import SweepRequest, run_sweep

SUMMARY_FILE = "compare.json"
_ROW_KEYS = ("name", "source", "bits_per_element", "bits_per_element_at_4096",
             "ppl", "ppl_baseline", "delta_ppl", "delta_ppl_ci95_low",
             "delta_ppl_ci95_high", "kl_mean", "top1_agreement",
             "num_windows", "window_len")


def run_command(config_arg: str, overrides: Sequence[str] = (),
                eval_data: str | None = None, model: str | None = None
                ) -> str:
  """The `experiments.run` command line that evaluates one side alone."""
  parts = ["python -m experiments.run", f"--config={config_arg}",
           *overrides]
  if eval_data:
    parts.append(f"--eval_data={eval_data}")
  if model:
    parts.append(f"--model={model}")
  return " ".join(parts)


def run_compare(config: ml_collections.ConfigDict, name: str, against: str,
                workdir: str, *, overrides: Sequence[str] = (),
                eval_data: str | None = None, model: str | None = None
                ) -> dict:
  """Evaluates `name` (the config) and `against` on the same windows.

  Args:
    config: the --config preset with its overrides.
    name: its display name (`--config`'s short name).
    against: the other side, as one `--points` item.
    workdir: output directory.
    overrides: the `--config.FIELD=VALUE` arguments, for the commands.
    eval_data, model: as experiments.run takes them.

  Returns:
    The compare.json content.
  """
  against_name = against.rsplit("/", 1)[-1].removesuffix(".py")
  own = name
  if against_name == name:
    if not overrides:
      raise ValueError(f"compare: --config={name} against {against!r} is "
                       "the same preset; allowed: two different caches (or "
                       "--config.* overrides that make them differ).")
    own = f"{name}+overrides"
  request = SweepRequest(formats=(), points=(against,),
                         pairs=(f"{own}:{against_name}",), base_point=own)
  rows = run_sweep(config, workdir, request, eval_data=eval_data,
                   model=model)
  by_name = {r["name"]: r for r in rows}
  missing = [n for n in (own, against_name) if n not in by_name]
  if missing:  # The two specs are equal: the sweep evaluated one.
    raise ValueError(f"compare: {name} and {against} resolve to the same "
                     "cache spec; nothing to compare.")
  out_dir = pathlib.Path(workdir)
  sums, tokens = sweep_pairs.load_window_sums(out_dir / "per_window.npz")
  pair = sweep_pairs.pair_row(sums, tokens, own, against_name,
                              sweep_pairs.load_kl_sums(out_dir /
                                                       "per_window.npz"))
  summary = {
      "a": {k: by_name[own].get(k) for k in _ROW_KEYS},
      "b": {k: by_name[against_name].get(k) for k in _ROW_KEYS},
      "paired": pair,
      "commands": {
          "a": run_command(name, overrides, eval_data, model),
          "b": run_command(against, (), eval_data, model),
          "this": " ".join(["python -m experiments.compare",
                            f"--config={name}", *overrides,
                            f"--against={against}"]
                           + ([f"--eval_data={eval_data}"] if eval_data
                              else [])
                           + ([f"--model={model}"] if model else [])),
      },
      "machine": machine_description()}
  (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n",
                                      encoding="utf-8")
  print(summary_markdown(summary))
  print(f"wrote {out_dir / SUMMARY_FILE}")
  return summary


def summary_markdown(summary: dict) -> str:
  """Both rows and the paired line, as printed."""
  lines = ["| cache | eff. bits @512 | eff. bits @4096 | ΔPPL [95% CI] | KL "
           "|", "|---|---|---|---|---|"]
  for side in ("a", "b"):
    r = summary[side]
    ci = describe_delta_ci(r["delta_ppl"], r["delta_ppl_ci95_low"],
                           r["delta_ppl_ci95_high"])
    lines.append(f"| {r['name']} | {r['bits_per_element']:.2f} | "
                 f"{r['bits_per_element_at_4096']:.2f} | {ci} | "
                 f"{r['kl_mean']:.4g} |")
  p = summary["paired"]
  lines += ["", f"{p['a']} - {p['b']}, paired over {int(p['num_windows'])} "
            f"windows: ΔNLL {p['delta_nll_diff']:+.5f} ± "
            f"{p['delta_nll_diff_stderr']:.5f} nats (z {p['z']:.2f}), "
            f"KL {p['kl_diff']:+.5f} ± {p['kl_diff_stderr']:.5f} "
            f"(z {p['kl_z']:.2f}): {p['verdict']}.",
            f"{p['a']}: {summary['commands']['a']}",
            f"{p['b']}: {summary['commands']['b']}"]
  return "\n".join(lines)
