"""K int8 g32 + V int4 g32, symmetric: 6.5 bits/element (llama.cpp -ctk q8_0 -ctv q4_0).

Run: python -m experiments.run --config=k8v4
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=8, group_size=32)
  c.cache.v = base.kv(type='int', bits=4, group_size=32)
  return c
