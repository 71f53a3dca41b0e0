r"""Evaluate a KV-cache preset against the full-precision baseline.

  python -m experiments.run --config=int4_g32 [--workdir=DIR]
      [--eval_data=FILE] [--model=NAME_OR_PATH] [--config.eval.num_windows=40]
      [--mesh=DATAxMODEL] [--log_level=info]
      [--coordinator=HOST:PORT --num_processes=N --process_id=I]

With --coordinator, start the same command once per process (only
--process_id differs); --mesh then spans every process's devices and
process 0 writes the outputs.
"""

from absl import app
from absl import flags

from kvq_jax.cli import log_setup
from kvq_jax.cli.config_flag import DEFINE_preset_config, preset_name
from kvq_jax.cli.data_flags import DEFINE_data_flags
from kvq_jax.cli.distributed_flags import (DEFINE_distributed_flags,
                                           start_distributed)
from kvq_jax.cli.entry import run_main
from kvq_jax.run import runner

_CONFIG = DEFINE_preset_config("config", default="int4_g32")
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "output directory (default runs/<preset>)")
_EVAL_DATA, _MODEL = DEFINE_data_flags()
_MESH = flags.DEFINE_string(
    "mesh", "", "DATAxMODEL device mesh, e.g. 2x4: windows and KV caches "
    "over 'data', heads over 'model'; '' = one device. With several "
    "processes it spans all their devices: DATA * MODEL = global count")
_DISTRIBUTED = DEFINE_distributed_flags()


def main(argv):
  log_setup.configure_from_flags()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  start_distributed(_DISTRIBUTED)
  name = preset_name()
  runner.run(_CONFIG.value, _WORKDIR.value or f"runs/{name}",
             eval_data=_EVAL_DATA.value, model=_MODEL.value, name=name,
             mesh=_MESH.value or None)


if __name__ == "__main__":
  run_main(main)
