"""`run_main(main)`: every script's `absl.app.run`, bad input in one line.

A script's own checks raise `ValueError` (an unknown `--model`, a negative
memory, a bad `--points`), and the asset cache raises its own user-facing
errors (a download that failed, no space or permission under the cache root,
a lock held too long). Under plain `app.run` each printed a traceback of
twenty lines around a one-line message. `run_main` prints

  error: <the message>

on stderr and exits with status 1; `--log_level=debug` (`cli.log_setup`)
lets the exception through, traceback and all. A flag that does not parse
or fails its validator (e.g. `--eval_data` naming no file,
`cli.data_flags`) prints the same one line instead of absl's two, before
`main` runs. `app.UsageError` keeps absl's usage message. Other exceptions
are bugs, not bad input: their traceback always shows.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

from absl import app
from absl import flags

from kvq_jax.assets.cache_errors import CacheWriteError
from kvq_jax.assets.entry_lock import LockTimeoutError
from kvq_jax.assets.registry import AssetFetchError
from kvq_jax.cli import log_setup

# What bad input (and the asset cache, about the machine) raises: a message
# for the user, not a bug's traceback.
USER_ERRORS = (ValueError, AssetFetchError, CacheWriteError, LockTimeoutError)
EXIT_STATUS = 1


def _print_error(error: BaseException) -> None:
  print(f"error: {error}", file=sys.stderr, flush=True)


def _parse_flags(argv: Sequence[str]) -> list[str]:
  """`flags.FLAGS(argv)`; a flag error printed in one line, exit 1."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _print_error(e)
    sys.exit(EXIT_STATUS)


def one_line_errors(main: Callable[[list[str]], object]
                    ) -> Callable[[list[str]], object]:
  """`main` with USER_ERRORS printed as one line (exit status 1) unless
  `--log_level=debug`."""
  def wrapped(argv: list[str]) -> object:
    try:
      return main(argv)
    except USER_ERRORS as e:
      if log_setup.debug_requested():
        raise
      _print_error(e)
      return EXIT_STATUS
  return wrapped


def run_main(main: Callable[[list[str]], object]) -> None:
  """`app.run(main)` with bad input in one line (module docstring)."""
  app.run(one_line_errors(main), flags_parser=_parse_flags)
