"""Full-precision dtypes by name: what a decoder computes in and a dense
cache stores.

`parse_dtype` reads a config field (`config.dtype`, `config.cache.dtype`):
the canonical names only. `dense_dtype_name` reads a cache kind
(`settings.kinds`), which also takes the short spellings (bf16, fp16,
f32, fp32).
"""

from __future__ import annotations

import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
          "float16": jnp.float16}
# Every name of a dense cache kind -> its canonical dtype name.
DENSE_NAMES = {"bf16": "bfloat16", "float32": "float32", "fp16": "float16",
               "bfloat16": "bfloat16", "float16": "float16", "f32": "float32",
               "fp32": "float32"}


def parse_dtype(name: str, field: str = "dtype"):
  """The jnp dtype named `name`; ValueError naming `field` otherwise."""
  if name not in DTYPES:
    raise ValueError(
        f"{field}={name!r}: allowed values are {', '.join(DTYPES)}.")
  return DTYPES[name]


def dense_dtype_name(name: str) -> str | None:
  """'bf16' -> 'bfloat16' (any `DENSE_NAMES` spelling); None for a name
  that is not a dtype."""
  return DENSE_NAMES.get(name)
