"""Persisting KV caches: save a prompt's cache, restore it and keep decoding."""

from kvq_jax.persist.cache_checkpoint import restore_cache
from kvq_jax.persist.cache_checkpoint import save_cache

__all__ = ["restore_cache", "save_cache"]
