"""llama.cpp q5_1 K and V (-ctk q5_1 -ctv q5_1): 6.0 bits/element, bit-exact values.

Blocks of 32 along head_dim with llama.cpp's Q5_1 arithmetic:
d = (max - min) / 31 in float32, code = trunc((x - min) * (1 / d) + 0.5)
clipped to 0..31, d and min stored as float16 rounded to nearest.
quantize -> dequantize equals gguf-py's quants.quantize -> quants.dequantize
element for element (tests/quant/test_ggml_exact.py). int5, scheme=asymmetric,
rounding='ggml'; no full-precision residual, every token committed to the
quantized cache as it is written (flush_block 1).

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +0.302 [+0.215, +0.388]
against baseline PPL 23.5115, KL 0.01065 ± 0.00036, top-1 0.9398 ± 0.0020;
stored 6.00 bits/element, effective 6.00 at 512 tokens and 6.00 at 4096. Full
precision: K: none; V: none.

Run: python -m experiments.run --config=q5_1
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.ggml_kv('q5_1')
  c.cache.v = base.ggml_kv('q5_1')
  return c
