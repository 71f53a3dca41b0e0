"""Which model and text a key-stats recipe resolves for, and who builds it.

`cache.key_stats = 'auto[:...]'` (a recipe) names statistics that depend on
the model being run and its calibration text, which a config alone does not
say. An experiment's library call opens `use(KeyStatsRun(model, eval_data,
resolve))` around its work (`calibration.auto_key_stats.run_context` does,
with the builder as `resolve`); `settings_from_config` then resolves every
recipe it meets, in the experiment's own config and in the presets it
compares (sweep points, compared kinds), through `current()`. Outside any
run a recipe is refused. This module sits below `calibration` (the builder)
so that `settings` can call it without importing it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import pathlib
from typing import Callable, Iterator

from kvq_jax.cache.key_stats_recipe import RECIPE, is_recipe  # pylint: disable=unused-import

# resolve(recipe, model, eval_data, window_len, num_eval_windows, dtype)
#   -> (key-stats directory, where it came from)
Resolver = Callable[[str, str, "str | None", int, int, str],
                    "tuple[pathlib.Path, dict]"]


@dataclasses.dataclass(frozen=True)
class KeyStatsRun:
  """The model an experiment runs, its text (None: the default text), the
  recipe builder, and every recipe resolved so far ({recipe: source})."""

  model: str
  eval_data: str | None
  resolve: Resolver
  resolved: dict = dataclasses.field(default_factory=dict)


_RUN: contextvars.ContextVar[KeyStatsRun | None] = contextvars.ContextVar(
    "kvq_jax_key_stats_run", default=None)


@contextlib.contextmanager
def use(run: KeyStatsRun) -> Iterator[KeyStatsRun]:
  """Within the block, recipes resolve through `run` (module docstring)."""
  token = _RUN.set(run)
  try:
    yield run
  finally:
    _RUN.reset(token)


def current() -> KeyStatsRun | None:
  """The innermost open run, or None."""
  return _RUN.get()


def resolved_in_run() -> dict[str, dict]:
  """{recipe: where it came from} for the recipes the innermost run has
  resolved so far (for a run's metrics); {} outside a run."""
  run = _RUN.get()
  return {} if run is None else dict(run.resolved)
