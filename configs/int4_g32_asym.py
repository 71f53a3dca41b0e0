"""int4 K and V, asymmetric (scale + zero), groups of 32 along head_dim: 5.0 bits/element (llama.cpp q4_1's layout).

Run: python -m experiments.run --config=int4_g32_asym
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)
  c.cache.v = base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)
  return c
