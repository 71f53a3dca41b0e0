r"""Paged cache == contiguous cache, for every distinct layer of every preset.

  python -m experiments.paged_check [--presets=int8,kivi2] \
      [--model=smollm2-135m] [--out=runs/paged_check.json]

Per preset and distinct layer spec (calibrated numbers aside: one layer per
code path), `kvq_jax.serving.paged_check.compare` runs a ragged prefill, a
16-token chunk and 64 decode steps through a paged cache (pages scattered
at random) and the contiguous cache of the same spec on the model's layer
shapes (random queries, keys and values; no weights loaded), and prints
the largest absolute difference of the attention outputs, or why the paged
cache refused the layer. Presets whose key statistics are missing get
identity stand-ins of the model's shape (the code path is the same).
"""

from __future__ import annotations

import tempfile

from absl import app
from absl import flags

from kvq_jax import assets
from kvq_jax.bench.timing import write_measured
from kvq_jax.cli import log_setup
from kvq_jax.cli.entry import run_main
from kvq_jax.facade import model_config
from kvq_jax.serving.paged_check import check_presets
from kvq_jax.settings.presets import available_presets

_PRESETS = flags.DEFINE_list("presets", None, "preset names; default: all")
_MODEL = flags.DEFINE_string("model", assets.DEFAULT_MODEL,
                             "registered model name or path (shapes only)")
_OUT = flags.DEFINE_string("out", None, "JSON output path")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  with tempfile.TemporaryDirectory() as stand_in:
    rows = check_presets(model_config(_MODEL.value),
                         _PRESETS.value or available_presets(), stand_in)
  worst = max(r.get("max_abs_diff", 0.0) for r in rows)
  refused = sum("refused" in r for r in rows)
  print(f"{len(rows)} layers checked; largest difference {worst:.3g}; "
        f"{refused} refused")
  if _OUT.value:
    write_measured(_OUT.value, {"model": _MODEL.value, "rows": rows})


if __name__ == "__main__":
  run_main(main)
