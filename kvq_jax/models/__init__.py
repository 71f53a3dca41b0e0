"""Llama-family decoder in Flax NNX.

Import from the submodules (`models.decoder`, `models.runtime`,
`models.generate`, `models.params`); this package file stays empty of imports
so `kvq_jax.cache` can depend on `models.config`/`models.rope` without a cycle.
"""
