"""Decoders in Flax NNX: the llama family (`models.decoder`) and Gemma 3
(`models.gemma3`), picked by `ModelConfig.name` in `models.params`.

Import from the submodules (`models.decoder`, `models.gemma3`,
`models.runtime`, `models.generate`, `models.params`); this package file
stays empty of imports so `kvq_jax.cache` can depend on
`models.config`/`models.rope` without a cycle.
"""
