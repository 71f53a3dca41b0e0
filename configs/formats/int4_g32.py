"""int4 K and V, symmetric, groups of 32 along head_dim, bfloat16 scales: 4.5 bits/element.

The same 16-level set as llama.cpp's q4_0 (scale = signed max / -8), but not
bit-exact with it: bfloat16 scales rounded up in magnitude and codes rounded
half to even from the stored scale (rounding='kvq'). configs/formats/q4_0.py is the
bit-exact q4_0.

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +2.62 [+2.35, +2.90]
against baseline PPL 23.5115, KL 0.0906 ± 0.0027, top-1 0.8300 ± 0.0039; stored
4.50 bits/element, effective 4.50 at 512 tokens and 4.50 at 4096. Full
precision: K: none; V: none.

Run: python -m experiments.run --config=int4_g32
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, group_size=32)
  c.cache.v = base.kv(type='int', bits=4, group_size=32)
  return c
