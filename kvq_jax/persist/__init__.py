"""On disk: KV caches and calibrated key statistics.

* `cache_checkpoint`: save a prompt's cache, restore it and keep decoding.
* `key_stats_store`: calibrated key affines (shift, scale, codebooks,
  rotations) that presets load with `cache.key_stats = DIR`.
"""

from kvq_jax.persist.cache_checkpoint import restore_cache
from kvq_jax.persist.cache_checkpoint import save_cache

__all__ = ["restore_cache", "save_cache"]
