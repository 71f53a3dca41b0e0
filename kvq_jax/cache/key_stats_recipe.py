"""The text form of a key-stats recipe: 'auto' or 'auto:name=value,...'.

`cache.key_stats` is a directory or a recipe, which names statistics built
for the model being run (`calibration.auto_key_stats` builds and validates
them; `settings.key_stats_context` resolves them). This module holds only
the syntax, low enough that code which merely shapes a stand-in (the
capacity planner, the paged-cache check) can read a recipe's mode and
rotation without importing the builder.
"""

from __future__ import annotations

RECIPE = "auto"
DEFAULT_MODE = "std"  # `KeyStatsOptions.mode` when a recipe names none.


def is_recipe(value: str) -> bool:
  return value == RECIPE or value.startswith(RECIPE + ":")


def recipe_items(value: str) -> list[str]:
  """The recipe's 'name=value' items as written (unvalidated)."""
  return list(filter(None, value[len(RECIPE) + 1:].split(",")))


def recipe_fields(value: str) -> dict[str, str] | None:
  """{name: text} of a recipe (unvalidated), None when `value` is not one."""
  if not is_recipe(value):
    return None
  return dict(item.partition("=")[::2] for item in recipe_items(value))


def recipe_shape(value: str) -> tuple[str, bool] | None:
  """(mode, rotated) a recipe's statistics will have, None for a path."""
  fields = recipe_fields(value)
  if fields is None:
    return None
  return (fields.get("mode", DEFAULT_MODE),
          fields.get("rotation", "none") != "none")
