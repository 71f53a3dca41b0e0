"""llama.cpp q8_0 K and V (-ctk q8_0 -ctv q8_0): 8.5 bits/element, bit-exact values.

Blocks of 32 along head_dim with llama.cpp's Q8_0 arithmetic:
d = absmax / 127 in float32, code = x * (1 / d) rounded half away from
zero (255 codes, -127..127), d stored as float16 rounded to nearest.
quantize -> dequantize equals gguf-py's quants.quantize -> quants.dequantize
element for element (tests/quant/test_ggml_exact.py). int8,
scheme=symmetric_narrow, rounding='ggml'; no full-precision residual, every
token committed to the quantized cache as it is written (flush_block 1).

Measured: (to be filled by the lead)

Run: python -m experiments.run --config=q8_0
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=8, scheme='symmetric_narrow',
                      group_size=32, scale_dtype='float16', rounding='ggml')
  c.cache.v = base.kv(type='int', bits=8, scheme='symmetric_narrow',
                      group_size=32, scale_dtype='float16', rounding='ggml')
  c.cache.residual = 0
  c.cache.flush_block = 1
  return c
