"""K int8 g32 + V int4 g32, symmetric, bfloat16 scales: 6.5 bits/element.

The layout of llama.cpp's -ctk q8_0 -ctv q4_0 with this project's rounding
(full-level int8 keys, bfloat16 scales rounded up); the bit-exact peer is the
sweep point `q8_0/q4_0`.

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +0.293 [+0.226, +0.361]
against baseline PPL 23.5115, KL 0.00948 ± 0.00040, top-1 0.9440 ± 0.0026;
stored 6.50 bits/element, effective 6.50 at 512 tokens and 6.50 at 4096. Full
precision: K: none; V: none.

Run: python -m experiments.run --config=k8v4
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=8, group_size=32)
  c.cache.v = base.kv(type='int', bits=4, group_size=32)
  return c
