"""Named presets: `configs/ROLE/.../NAME.py` files, resolved by name or path.

configs/ is sorted by role (`ROLES`): `formats/` (a format as a peer
ships it: int8, q4_0, kivi*, kvq4, fp8...), `methods/` (this project's
method families: tq, kq, tc, ca), `alloc/<model>/` (per-layer
allocations, each made for one model: `config.made_for`) and `archive/`
(superseded presets, each saying by what and by how much). A preset's
name is its file's stem and is unique across the tree, so `--config=NAME`
resolves wherever the file sits; a folder-qualified name
(`--config=formats/int8`, `alloc/smollm2-135m/cvmix250`) resolves too;
anything else is used as a path (`path:arg` keeps its argument).
`load_preset` runs the file's `get_config()`. The `--config` flag
(`cli.config_flag`) and cache kinds (`settings.kinds`: the benchmarks'
and the capacity plan's `--kinds`, the sweep's `--points`, ...) resolve
through here; `experiments.presets` lists them all.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib

import ml_collections

import configs as _configs_package

CONFIG_DIR = pathlib.Path(_configs_package.__file__).parent
ROLES = ("formats", "methods", "alloc", "archive")
_NOT_PRESETS = ("base", "__init__")


@functools.lru_cache(maxsize=None)
def preset_paths() -> dict[str, pathlib.Path]:
  """{name: file} of every preset under configs/ (names are unique)."""
  paths: dict[str, pathlib.Path] = {}
  for path in sorted(CONFIG_DIR.rglob("*.py")):
    if path.stem in _NOT_PRESETS or path.stem.startswith("_"):
      continue
    if path.stem in paths:
      raise ValueError(f"configs/: two presets named {path.stem!r} "
                       f"({paths[path.stem]} and {path}); allowed: one "
                       "name per preset.")
    paths[path.stem] = path
  return paths


def available_presets() -> list[str]:
  return sorted(preset_paths())


def is_preset(name: str) -> bool:
  """A preset file, a preset's name or a folder-qualified name."""
  return (name.endswith(".py") or name in preset_paths()
          or ("/" in name and (CONFIG_DIR / f"{name}.py").is_file()))


def preset_role(name: str) -> str:
  """The role folder a preset sits in (`ROLES`)."""
  return preset_paths()[name].relative_to(CONFIG_DIR).parts[0]


def resolve_config_path(value: str) -> str:
  """'int4_g32' or 'formats/int4_g32' -> '.../configs/formats/int4_g32.py';
  paths pass through."""
  path, sep, arg = value.partition(":")
  if not path.endswith(".py"):
    found = preset_paths().get(path) or CONFIG_DIR / f"{path}.py"
    if found is None or not found.is_file():
      if "/" in path and pathlib.Path(path).is_file():
        return path + sep + arg
      raise ValueError(
          f"--config={value!r}: no preset named {path!r}; available: "
          f"{', '.join(available_presets())} (or give a path to a .py file).")
    path = str(found)
  elif not pathlib.Path(path).is_file():
    moved = pathlib.PurePath(path)
    if moved.parent.name == "configs" and moved.stem in preset_paths():
      return str(preset_paths()[moved.stem]) + sep + arg  # Before roles.
    raise ValueError(f"--config={value!r}: no such config file {path!r}.")
  return path + sep + arg


def load_preset(name_or_path: str) -> ml_collections.ConfigDict:
  """A preset's `get_config()`: a name in configs/ or a path to a .py file."""
  path = resolve_config_path(name_or_path)
  module_spec = importlib.util.spec_from_file_location("_kvq_preset", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config()
