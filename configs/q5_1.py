"""llama.cpp q5_1 K and V (-ctk q5_1 -ctv q5_1): 6.0 bits/element, bit-exact values.

Blocks of 32 along head_dim with llama.cpp's Q5_1 arithmetic:
d = (max - min) / 31 in float32, code = trunc((x - min) * (1 / d) + 0.5)
clipped to 0..31, d and min stored as float16 rounded to nearest.
quantize -> dequantize equals gguf-py's quants.quantize -> quants.dequantize
element for element (tests/quant/test_ggml_exact.py). int5, scheme=asymmetric,
rounding='ggml'; no full-precision residual, every token committed to the
quantized cache as it is written (flush_block 1).

Measured: (to be filled by the lead)

Run: python -m experiments.run --config=q5_1
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=5, scheme='asymmetric', group_size=32,
                      scale_dtype='float16', rounding='ggml')
  c.cache.v = base.kv(type='int', bits=5, scheme='asymmetric', group_size=32,
                      scale_dtype='float16', rounding='ggml')
  c.cache.residual = 0
  c.cache.flush_block = 1
  return c
