"""A dense float16 KV cache against the float32 baseline.

Run: python -m experiments.run --config=fp16
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='none')
  c.cache.v = base.kv(type='none')
  c.cache.dtype = 'float16'
  return c
