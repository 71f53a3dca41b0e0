"""The cache kinds the speed benchmarks compare, by name.

A kind is "bf16" or "float32" (the dense full-precision cache in that
storage dtype; the fastest of the two is the baseline a quantized cache has
to beat) or any preset (`configs/NAME.py` or a path to a preset file): its
cache spec and cache dtype, exactly what `experiments.run --config=NAME`
decodes with. Presets whose key statistics are missing fail with the
preset's own message (they name the calibration command).
"""

from __future__ import annotations

import jax.numpy as jnp

from kvq_jax.cache.spec import CacheSpec
from kvq_jax.settings.experiment_settings import settings_from_config
from kvq_jax.settings.presets import load_preset

FULL_PRECISION = {"bf16": jnp.bfloat16, "float32": jnp.float32}
DEFAULT_KINDS = ("bf16", "float32", "int8", "q4_0", "kivi2", "kvq4")


def resolve_kind(name: str) -> tuple[CacheSpec | None, jnp.dtype]:
  """(cache spec or None for a dense cache, the cache dtype) of `name`."""
  if name in FULL_PRECISION:
    return None, jnp.dtype(FULL_PRECISION[name])
  try:
    config = load_preset(name)
  except (FileNotFoundError, ValueError) as e:
    raise ValueError(
        f"cache kind {name!r}: {e} Allowed: {', '.join(FULL_PRECISION)} or "
        "a preset name / file.") from e
  settings = settings_from_config(config)
  spec = settings.cache_spec if settings.quantize else None
  return spec, jnp.dtype(settings.cache_dtype)
