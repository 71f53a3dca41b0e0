"""Gemma 3 270M: int4 g32 asymmetric K/V on the 15 sliding-window layers, int8 on the 3 global layers (5, 11, 17).

At long context only the global layers grow (the local rings hold 512
tokens each), so their precision sets the cost per token: this preset keeps
int8 per token (8 + 16/256 bits with Gemma's head_dim 256) on the layers that
see the whole context and 5 bits in the local rings. Measured figures:
results/models.md "Results per model".

Run: python -m experiments.run --config=gemma3_int4_global8
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.model = 'gemma3-270m'
  c.cache.k = base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)
  c.cache.v = base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)
  c.cache.layer_overrides = '5,11,17:int8/int8'
  c.made_for = "gemma3-270m"
  return c
