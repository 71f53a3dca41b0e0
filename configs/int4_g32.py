"""int4 K and V, symmetric, groups of 32 along head_dim, bfloat16 scales: 4.5 bits/element.

The same 16-level set as llama.cpp's q4_0 (scale = signed max / -8), but not
bit-exact with it: bfloat16 scales rounded up in magnitude and codes rounded
half to even from the stored scale (rounding='kvq'). configs/q4_0.py is the
bit-exact q4_0.

Measured: (to be filled by the lead)

Run: python -m experiments.run --config=int4_g32
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, group_size=32)
  c.cache.v = base.kv(type='int', bits=4, group_size=32)
  return c
