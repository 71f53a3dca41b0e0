"""Checkpoint assets: named models fetched once, and a converted-params cache.

`resolve_model(name | path) -> pathlib.Path` (names: `REGISTRY`) and
`load_params_cached(name_or_path) -> (ModelConfig, params, TextTokenizer)`.
Files live under `cache_root()` ($KVQ_JAX_CACHE, else
$XDG_CACHE_HOME/kvq_jax, else ~/.cache/kvq_jax).
"""

from __future__ import annotations

from kvq_jax.assets.cache_dir import cache_root
from kvq_jax.assets.param_cache import load_params_cached
from kvq_jax.assets.registry import AssetFetchError
from kvq_jax.assets.registry import DEFAULT_MODEL
from kvq_jax.assets.registry import PartedWheelAsset
from kvq_jax.assets.registry import REGISTRY
from kvq_jax.assets.registry import WheelAsset
from kvq_jax.assets.registry import WheelPart
from kvq_jax.assets.registry import is_fetched
from kvq_jax.assets.registry import resolve_model

__all__ = ["cache_root", "load_params_cached", "resolve_model", "REGISTRY",
           "DEFAULT_MODEL", "WheelAsset", "WheelPart", "PartedWheelAsset",
           "AssetFetchError", "is_fetched"]
