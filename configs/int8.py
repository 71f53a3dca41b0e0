"""int8 K and V, symmetric, one bfloat16 scale per (token, head): 8.25 bits/element at head_dim 64.

Run: python -m experiments.run --config=int8
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=8, granularity='per_token', group_size=0)
  c.cache.v = base.kv(type='int', bits=8, granularity='per_token', group_size=0)
  return c
