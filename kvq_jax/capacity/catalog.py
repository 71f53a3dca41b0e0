"""Where a capacity plan's names resolve: handed in by the caller.

Registered models (`assets`) and presets (`settings`) live in packages
above `capacity` in the layout (tests/test_layout.py), so the planner does
not import them: a script builds a `Catalog` from them
(`experiments/capacity.py`) and the planner only calls it. Named
architectures (`capacity.architectures`) need no catalog.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import ml_collections

from kvq_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Catalog:
  """Names and loaders of models and presets.

  Attributes:
    models: the registered model names (listed in errors).
    model_config: a registered name or a model path -> its ModelConfig,
      read from the file's metadata (no weights loaded).
    presets: the preset names (configs/NAME.py).
    load_preset: a preset name -> its `get_config()` ConfigDict (a fresh
      one per call: the planner edits it).
    settings_from_config: ConfigDict -> settings with `.quantize`,
      `.cache_spec` and `.cache_dtype` (ValueError on a bad preset).
  """

  models: tuple[str, ...]
  model_config: Callable[[str], ModelConfig]
  presets: tuple[str, ...]
  load_preset: Callable[[str], ml_collections.ConfigDict]
  settings_from_config: Callable[[ml_collections.ConfigDict], Any]
