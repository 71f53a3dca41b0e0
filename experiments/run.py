r"""Evaluate a KV-cache preset against the full-precision baseline.

  python -m experiments.run --config=int4_g32 [--workdir=DIR]
      [--eval_data=FILE] [--model=NAME_OR_PATH] [--config.eval.num_windows=40]
      [--mesh=DATAxMODEL]
"""

from absl import app
from absl import flags

from kvq_jax.experiment import runner
from kvq_jax.experiment.config_flag import DEFINE_preset_config, preset_name
from kvq_jax.experiment.data_flags import DEFINE_data_flags

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "output directory (default runs/<preset>)")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_MESH = flags.DEFINE_string(
    "mesh", "", "DATAxMODEL device mesh, e.g. 2x4: windows and KV caches "
    "over 'data', heads over 'model'; '' = one device")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  name = preset_name()
  runner.run(_CONFIG.value, _WORKDIR.value or f"runs/{name}",
             eval_data=_EVAL_DATA.value, model=_MODEL.value, name=name,
             mesh=_MESH.value or None)


if __name__ == "__main__":
  app.run(main)
