"""llama.cpp q8_0 K and V (-ctk q8_0 -ctv q8_0): 8.5 bits/element, bit-exact values.

Blocks of 32 along head_dim with llama.cpp's Q8_0 arithmetic:
d = absmax / 127 in float32, code = x * (1 / d) rounded half away from
zero (255 codes, -127..127), d stored as float16 rounded to nearest.
quantize -> dequantize equals gguf-py's quants.quantize -> quants.dequantize
element for element (tests/quant/test_ggml_exact.py). int8,
scheme=symmetric_narrow, rounding='ggml'; no full-precision residual, every
token committed to the quantized cache as it is written (flush_block 1).

Measured (SmolLM2-135M-Instruct, Q4_1 GGUF weights; WikiText-2 test, first 40
windows x 512, second-half scoring, float32 compute, 2-core CPU; one sweep for
all presets, command in results/formats.md "Results"): dPPL +0.010 [−0.003, +0.024]
against baseline PPL 23.5115 (no measurable change), KL 0.000320 ± 0.000010,
top-1 0.98961 ± 0.00099; stored 8.50 bits/element, effective 8.50 at 512 tokens
and 8.50 at 4096. Full precision: K: none; V: none.

Run: python -m experiments.run --config=q8_0
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.ggml_kv('q8_0')
  c.cache.v = base.ggml_kv('q8_0')
  return c
