"""Quiet logging for the experiment scripts: other libraries' INFO off.

`absl.app.run` turns INFO on for every logger (absl's `--verbosity` becomes 0
once flags are parsed), so a run prints orbax's, absl's and jax's INFO lines
(a dozen or more per model load) around kvq_jax's own few.
`configure_from_flags()`, the first call of every script's `main`, keeps on
absl's handler:

  * kvq_jax's own records (modules of `kvq_jax`, `experiments`, `configs`)
    at INFO and above, INFO printed without absl's prefix;
  * other libraries' records at `--log_level` (default `warning`) and above.

`warnings.warn` (e.g. the Pallas -> XLA fallback of
`kvq_jax.kernels.dispatch`) does not go through logging: it always shows.
`--log_level=info` (or `debug`) brings every library's records back with
absl's prefix; an explicit absl `--verbosity=N` (`-v N`) leaves absl's own
logging as it set it (0: INFO, 1: DEBUG), `--log_level` unused.
"""

from __future__ import annotations

import logging
import os

from absl import flags
from absl import logging as absl_logging

import kvq_jax

LOG_LEVELS = ("debug", "info", "warning", "error")

_LOG_LEVEL = flags.DEFINE_enum(
    "log_level", "warning", LOG_LEVELS,
    "lowest level of other libraries' (orbax, absl, jax) log records shown; "
    "kvq_jax's own messages and Python warnings always show. An explicit "
    "--verbosity (absl's) wins over it. debug also shows the traceback of "
    "an error that bad input raised (cli.entry), else one line.")

# kvq_jax and the packages installed beside it (pyproject's packages.find).
_INSTALL_DIR = os.path.dirname(os.path.dirname(
    os.path.realpath(kvq_jax.__file__)))
OWN_DIRS = tuple(os.path.join(_INSTALL_DIR, name) + os.sep
                 for name in ("kvq_jax", "experiments", "configs"))


class OtherLibrariesFilter(logging.Filter):
  """Passes every record from `own_dirs`, others' from `level` up."""

  def __init__(self, level: int, own_dirs: tuple[str, ...] = OWN_DIRS):
    super().__init__()
    self.level, self.own_dirs = level, own_dirs

  def filter(self, record: logging.LogRecord) -> bool:
    return (record.levelno >= self.level
            or os.path.realpath(record.pathname).startswith(self.own_dirs))


def configure(log_level: str = "warning",
              handler: logging.Handler | None = None) -> None:
  """Shows other libraries' records on `handler` from `log_level` up.

  Args:
    log_level: one of LOG_LEVELS. Records below the loggers' own levels
      (INFO under `absl.app.run`) stay off whatever this says.
    handler: default absl's handler (the one `absl.app.run` installs).
      The filter of an earlier call on it is replaced.

  Raises:
    ValueError: `log_level` is not one of LOG_LEVELS.
  """
  if log_level not in LOG_LEVELS:
    raise ValueError(f"log_level={log_level!r} is not supported; allowed: "
                     f"{', '.join(LOG_LEVELS)}.")
  handler = handler or absl_logging.get_absl_handler()
  for old in [f for f in handler.filters
              if isinstance(f, OtherLibrariesFilter)]:
    handler.removeFilter(old)
  handler.addFilter(OtherLibrariesFilter(
      logging.getLevelName(log_level.upper())))


def debug_requested() -> bool:
  """Whether `--log_level=debug` was given (the flags are parsed)."""
  return _LOG_LEVEL.value == "debug"


def configure_from_flags() -> None:
  """`configure(--log_level)` unless absl's `--verbosity` was given.

  Call first in `main` (flags are parsed there). `--log_level=debug` also
  lowers the loggers to DEBUG; at `warning` and `error` kvq_jax's INFO lines
  print bare (absl's `--showprefixforinfo=false`, unless given).
  """
  flag_values = flags.FLAGS
  if flag_values["verbosity"].present:
    return
  if _LOG_LEVEL.value == "debug":
    absl_logging.set_verbosity(absl_logging.DEBUG)
  configure(_LOG_LEVEL.value)
  if (_LOG_LEVEL.value in ("warning", "error")
      and not flag_values["showprefixforinfo"].present):
    flag_values.showprefixforinfo = False
