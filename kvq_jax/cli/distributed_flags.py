"""`--coordinator`, `--num_processes`, `--process_id`: one run, N processes.

  holders = DEFINE_distributed_flags()       # at module level of a script
  start_distributed(holders)                 # first in main, before any JAX

All unset (and JAX_COORDINATOR_ADDRESS unset): one process, as before. See
`kvq_jax.sharding.distributed` for what each combination starts.
"""

from __future__ import annotations

import dataclasses

from absl import app
from absl import flags

from kvq_jax.sharding import distributed


@dataclasses.dataclass(frozen=True)
class DistributedFlags:
  coordinator: flags.FlagHolder
  num_processes: flags.FlagHolder
  process_id: flags.FlagHolder


def DEFINE_distributed_flags() -> DistributedFlags:  # pylint: disable=invalid-name
  """Defines the three flags; returns their holders."""
  return DistributedFlags(
      coordinator=flags.DEFINE_string(
          "coordinator", None,
          "HOST:PORT of process 0 for a multi-process run (every process "
          "gets the same value), or 'auto' for JAX's cluster detection "
          "(Cloud TPU, SLURM, Open MPI); unset: one process, unless "
          "JAX_COORDINATOR_ADDRESS is set"),
      num_processes=flags.DEFINE_integer(
          "num_processes", None, "processes in the run (with --coordinator)"),
      process_id=flags.DEFINE_integer(
          "process_id", None,
          "this process's index, 0..num_processes-1; process 0 writes the "
          "outputs"))


def start_distributed(holders: DistributedFlags) -> None:
  """`distributed.initialize` from the flags; app.UsageError naming them."""
  try:
    settings = distributed.distributed_settings(
        holders.coordinator.value, holders.num_processes.value,
        holders.process_id.value)
  except ValueError as e:
    raise app.UsageError(f"--coordinator/--num_processes/--process_id: {e}"
                         ) from e
  distributed.initialize(settings)
