"""int4 K and V, symmetric, groups of 32 along head_dim, bfloat16 scales: 4.5 bits/element (llama.cpp q4_0's layout).

Run: python -m experiments.run --config=int4_g32
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, group_size=32)
  c.cache.v = base.kv(type='int', bits=4, group_size=32)
  return c
