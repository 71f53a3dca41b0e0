"""K int8 g32 + V int4 g32, symmetric: 6.5 bits/element (llama.cpp -ctk q8_0 -ctv q4_0).

Measured (SmolLM2-135M-Instruct, WikiText-2 test, 40 windows x 512, second-half
scoring, float32 compute, 2-core CPU): PPL 23.8716 vs baseline 23.5115
(dPPL +0.3601), KL 0.01138, top-1 0.9412, 6.500 bits/element,
9360 bytes/token over 30 layers (measured from the cache leaves).

Run: python -m experiments.run --config=k8v4
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=8, group_size=32)
  c.cache.v = base.kv(type='int', bits=4, group_size=32)
  return c
