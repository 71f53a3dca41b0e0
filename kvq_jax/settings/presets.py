"""Named presets: `configs/NAME.py` files, resolved by name or path.

A bare name resolves to `configs/NAME.py` (the `configs` package shipped
beside `kvq_jax`); anything else is used as a path (`path:arg` keeps its
argument). `load_preset` runs the file's `get_config()`. The `--config` flag
(`cli.config_flag`) and cache kinds (`settings.kinds`: the benchmarks'
and the capacity plan's `--kinds`, the sweep's `--points`, ...) resolve
through here.
"""

from __future__ import annotations

import importlib.util
import pathlib

import ml_collections

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


def load_preset(name_or_path: str) -> ml_collections.ConfigDict:
  """A preset's `get_config()`: a name in configs/ or a path to a .py file."""
  path = resolve_config_path(name_or_path)
  module_spec = importlib.util.spec_from_file_location("_kvq_preset", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config()
