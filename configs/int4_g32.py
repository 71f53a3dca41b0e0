"""int4 K and V, symmetric, groups of 32 along head_dim, bfloat16 scales: 4.5 bits/element (llama.cpp q4_0's layout).

Measured (SmolLM2-135M-Instruct, WikiText-2 test, 40 windows x 512, second-half
scoring, float32 compute, 2-core CPU): PPL 26.8235 vs baseline 23.5115
(dPPL +3.3120), KL 0.11806, top-1 0.8113, 4.500 bits/element,
6480 bytes/token over 30 layers (measured from the cache leaves).

Run: python -m experiments.run --config=int4_g32
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, group_size=32)
  c.cache.v = base.kv(type='int', bits=4, group_size=32)
  return c
