"""int4 K and V, asymmetric (scale + zero), groups of 32 along head_dim: 5.0 bits/element (llama.cpp q4_1's layout).

Measured (SmolLM2-135M-Instruct, WikiText-2 test, 40 windows x 512, second-half
scoring, float32 compute, 2-core CPU): PPL 24.7514 vs baseline 23.5115
(dPPL +1.2399), KL 0.04944, top-1 0.8706, 5.000 bits/element,
7200 bytes/token over 30 layers (measured from the cache leaves).

Run: python -m experiments.run --config=int4_g32_asym
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)
  c.cache.v = base.kv(type='int', bits=4, scheme='asymmetric', group_size=32)
  return c
