"""`--config=NAME` resolution: a preset name, a path, or `path:arg`.

`DEFINE_config_file` from ml_collections expects a file path; researchers
type preset names (`--config=int4_g32`). `DEFINE_preset_config` accepts both:
a bare name resolves to `configs/NAME.py` (the `configs` package shipped
beside `kvq_jax`), anything else is used as a path. Overrides stay
ml_collections' own (`--config.cache.k.bits=8`), and the config is locked, so
an unknown key fails at parse time.
"""

from __future__ import annotations

import pathlib

from absl import flags
from ml_collections.config_flags import config_flags

import configs as _configs_package

CONFIG_DIR = pathlib.Path(_configs_package.__file__).parent


def available_presets() -> list[str]:
  return sorted(p.stem for p in CONFIG_DIR.glob("*.py")
                if not p.stem.startswith("_") and p.stem != "base")


def resolve_config_path(value: str) -> str:
  """'int4_g32' -> '.../configs/int4_g32.py'; paths pass through."""
  path, sep, arg = value.partition(":")
  if "/" not in path and not path.endswith(".py"):
    candidate = CONFIG_DIR / f"{path}.py"
    if not candidate.is_file():
      raise ValueError(
          f"--config={value!r}: no preset named {path!r}; available: "
          f"{', '.join(available_presets())} (or give a path to a .py file).")
    path = str(candidate)
  elif not pathlib.Path(path).is_file():
    raise ValueError(f"--config={value!r}: no such config file {path!r}.")
  return path + sep + arg


class _PresetParser(config_flags.ConfigFileFlagParser):

  def parse(self, path):
    return super().parse(resolve_config_path(path))


def DEFINE_preset_config(name: str = "config", default: str | None = None,
                         help_string: str = "preset name or config file",
                         flag_values: flags.FlagValues = flags.FLAGS):
  """Like config_flags.DEFINE_config_file(..., lock_config=True), plus names."""
  flag = config_flags._ConfigFlag(  # pylint: disable=protected-access
      parser=_PresetParser(name=name, lock_config=True),
      serializer=flags.ArgumentSerializer(), name=name, default=default,
      help_string=help_string, flag_values=flag_values,
      accept_new_attributes=False)
  return flags.DEFINE_flag(flag, flag_values)
