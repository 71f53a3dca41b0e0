"""Effective bits per held K/V element of each preset at several contexts.

  python scripts/effective_bits.py --model=gemma3-270m \
      --points=int8,q4_0,int4_g32_asym,kvq4,kivi4,kivi2 \
      --contexts=512,1024,2048,4096

Reads only the model's config (no weights; a preset whose key statistics
are a recipe resolves them for --model on --eval_data as a run does, from
the asset cache or built on first use; --base=PRESET is the preset the
short-spec points modify, as the sweep's --config) and prints one markdown
table:
per point its stored bits and `capacity.memory.effective_bits` at each
context (codes + scales + zeros + every full-precision token + per-layer
constants, divided by the elements the layers hold: min(T, W) on a
sliding-window layer), in the cache dtype given (default float32, the
presets' `config.dtype`; it changes only dense points: full-precision
windows are stored in `cache.window_dtype`). The numbers the sweep and
context_curve write into their CSVs come from the same function.
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp

from kvq_jax.assets.registry import resolve_model
from kvq_jax.calibration import auto_key_stats
from kvq_jax.capacity import memory
from kvq_jax.loaders import load_config
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.presets import load_preset
from kvq_jax.sweep.points import parse_points


def table(model: str, points: str, contexts: list[int],
          cache_dtype: str, base: str | None = None,
          eval_data: str | None = None) -> str:
  cfg = load_config(resolve_model(model))
  dtype = jnp.dtype(cache_dtype)
  # Key-statistics recipes resolve for this model and text (cached, or
  # built: that loads the weights once).
  with auto_key_stats.run_context(model, eval_data):
    spec = (settings_from_config(load_preset(base)).cache_spec if base
            else None)
    resolved = parse_points(points, spec, head_dim=cfg.head_dim,
                            num_layers=cfg.num_layers)
  lines = ["| point | stored | " + " | ".join(f"@{t}" for t in contexts)
           + " |", "|---|" + "---:|" * (len(contexts) + 1)]
  for p in resolved:
    cells = [f"{memory.effective_bits(cfg, p.spec, dtype, t):.2f}"
             for t in contexts]
    lines.append(f"| {p.name} | {memory.theoretical_bits(cfg, p.spec, dtype):.2f}"
                 f" | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="smollm2-135m")
  parser.add_argument("--points", required=True)
  parser.add_argument("--contexts", default="512,4096")
  parser.add_argument("--cache_dtype", default="float32")
  parser.add_argument("--base", default=None, help="preset the short-spec "
                      "points modify, as the sweep's --config")
  parser.add_argument("--eval_data", default=None, help="the text key "
                      "statistics recipes calibrate on, as the run's")
  args = parser.parse_args()
  print(table(args.model, args.points,
              [int(t) for t in args.contexts.split(",")], args.cache_dtype,
              args.base, args.eval_data))


if __name__ == "__main__":
  main()
