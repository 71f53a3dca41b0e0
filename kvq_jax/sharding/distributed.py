"""Starting JAX's multi-process runtime (`jax.distributed.initialize`).

  settings = distributed_settings("10.0.0.1:1234", num_processes=2,
                                  process_id=0)   # None: one process
  initialize(settings)          # before any JAX computation

After `initialize`, `jax.devices()` lists every process's devices (each
process keeps its own as `jax.local_devices()`), so `make_mesh` builds one
mesh over all of them and jitted programs run SPMD across the processes.
Every process must run the same program on the same inputs.

Which runtime `distributed_settings` asks for:
  * nothing given (and JAX_COORDINATOR_ADDRESS unset): None, one process;
  * coordinator 'HOST:PORT' with num_processes N and process_id I: exactly
    that (process 0 serves the coordinator on PORT);
  * coordinator 'auto', or none given while JAX's own JAX_COORDINATOR_ADDRESS
    is set: JAX's cluster detection (Cloud TPU, SLURM, Open MPI,
    Kubernetes) fills in whatever of the three was not given.

On CPU, computations that span processes need a cross-process collectives
implementation (`jax_cpu_collectives_implementation`); `initialize` sets
'gloo' when none is chosen (JAX 0.10 already defaults to it; an explicit
choice, e.g. JAX_CPU_COLLECTIVES_IMPLEMENTATION=mpi, is kept). A process
other than 0 then logs errors only: process 0 speaks for the run.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Mapping

import jax
from absl import logging

AUTO = "auto"
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"  # Read by JAX itself.
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[^\s:\[\]]+):"
                        r"(?P<port>\d+)$")


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
  """Arguments of `jax.distributed.initialize`; None: JAX detects it."""

  coordinator: str | None
  num_processes: int | None
  process_id: int | None


def _check_coordinator(coordinator: str) -> None:
  match = _HOST_PORT.match(coordinator)
  if not match or not 1 <= int(match["port"]) <= 65535:
    raise ValueError(
        f"coordinator={coordinator!r}: allowed: HOST:PORT (e.g. "
        "'10.0.0.1:1234' or 'localhost:1234', PORT 1..65535; the host of "
        f"process 0), or {AUTO!r} for JAX's cluster detection.")


def _check_counts(num_processes: int | None, process_id: int | None) -> None:
  for name, value, minimum in (("num_processes", num_processes, 1),
                               ("process_id", process_id, 0)):
    if value is not None and (isinstance(value, bool) or
                              not isinstance(value, int) or value < minimum):
      raise ValueError(
          f"{name}={value!r}: allowed: an integer >= {minimum}, or unset.")
  if (num_processes is not None and process_id is not None
      and process_id >= num_processes):
    raise ValueError(
        f"process_id={process_id} with num_processes={num_processes}: "
        f"allowed: 0 <= process_id < num_processes (0..{num_processes - 1}).")


def distributed_settings(coordinator: str | None = None,
                         num_processes: int | None = None,
                         process_id: int | None = None,
                         environ: Mapping[str, str] | None = None
                         ) -> DistributedSettings | None:
  """The multi-process runtime to start, or None for one process.

  Args:
    coordinator: 'HOST:PORT' of process 0, 'auto', or None / ''.
    num_processes: N >= 1, or None.
    process_id: 0 <= I < N, or None.
    environ: where to look for JAX_COORDINATOR_ADDRESS (default os.environ).

  Raises:
    ValueError: a malformed value, 'HOST:PORT' without both counts, or
      counts without any coordinator; the message says what is allowed.
  """
  environ = os.environ if environ is None else environ
  _check_counts(num_processes, process_id)
  coordinator = coordinator or None
  if coordinator == AUTO:
    return DistributedSettings(None, num_processes, process_id)
  if coordinator is not None:
    _check_coordinator(coordinator)
    if num_processes is None or process_id is None:
      raise ValueError(
          f"coordinator={coordinator!r} needs num_processes and process_id "
          f"(got {num_processes!r} and {process_id!r}); allowed: all three "
          f"(e.g. num_processes=2, process_id=0 on the first host), or "
          f"coordinator={AUTO!r} to let JAX detect them.")
    return DistributedSettings(coordinator, num_processes, process_id)
  if environ.get(ENV_COORDINATOR):
    return DistributedSettings(None, num_processes, process_id)
  if num_processes is not None or process_id is not None:
    raise ValueError(
        f"num_processes={num_processes!r}, process_id={process_id!r} without "
        f"a coordinator; allowed: also coordinator='HOST:PORT' (or {AUTO!r}, "
        f"or {ENV_COORDINATOR} in the environment), or none of them for one "
        "process.")
  return None


def initialize(settings: DistributedSettings | None) -> None:
  """Starts the runtime `settings` describes; None does nothing.

  Raises:
    RuntimeError: JAX already computed something in this process (its
      backends started single-process), or the runtime failed to start.
  """
  if settings is None:
    return
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=settings.coordinator,
                             num_processes=settings.num_processes,
                             process_id=settings.process_id)
  if jax.process_index() != 0:
    logging.set_verbosity(logging.ERROR)
