r"""Per-layer KV-cache sensitivity of a preset (and of extra formats).

  python -m experiments.layer_sensitivity --config=int4_g32 [--workdir=DIR]
      [--eval_data=FILE] [--model=NAME_OR_PATH] [--config.eval.num_windows=8]
      [--formats=int8,int2_g32_asym] [--noall_but_one] [--nocheck]
      [--from_end]

Quantizes one layer at a time (K only, V only, K and V) and all layers but
one (K and V) with the preset's formats, plus K-only / V-only per layer for
every --formats entry (the allocator's input: experiments.allocate), all with
one compiled forward. Writes sensitivity.{json,csv}, heatmap.png and
summary.txt to --workdir (default runs/sensitivity_<preset>).
"""

from absl import app
from absl import flags

from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config, preset_name
from kvq_jax.cli.data_flags import DEFINE_data_flags
from kvq_jax.cli.entry import run_main
from kvq_jax.research.sensitivity_runner import run_layer_sensitivity

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "output directory (default runs/sensitivity_<preset>)")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_FORMATS = flags.DEFINE_list(
    "formats", [], "extra per-tensor formats to measure K-only and V-only "
    "per layer (short names: int8,int4_g32_asym,int2_g32_asym,...)")
_K_FORMATS = flags.DEFINE_list(
    "k_formats", [], "extra formats to measure K-only (e.g. static keys: "
    "int4_st,int3_st_o1)")
_V_FORMATS = flags.DEFINE_list(
    "v_formats", [], "extra formats to measure V-only")
_ALL_BUT_ONE = flags.DEFINE_bool(
    "all_but_one", True, "also quantize all layers but one (K and V)")
_FROM_END = flags.DEFINE_bool(
    "from_end", False, "probe the last eval.num_windows windows of the text "
    "(disjoint from the first ones an allocation is verified on)")
_CHECK = flags.DEFINE_bool(
    "check", True, "compare the all-layers probe with the real quantized cache")


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  name = preset_name()
  run_layer_sensitivity(
      _CONFIG.value, _WORKDIR.value or f"runs/sensitivity_{name}",
      eval_data=_EVAL_DATA.value, model=_MODEL.value, name=name,
      formats=_FORMATS.value, all_but_one=_ALL_BUT_ONE.value,
      check=_CHECK.value, from_end=_FROM_END.value,
      k_formats=_K_FORMATS.value, v_formats=_V_FORMATS.value)


if __name__ == "__main__":
  run_main(main)
