"""llama.cpp q4_0 K and V (-ctk q4_0 -ctv q4_0): 4.5 bits/element, bit-exact values.

Blocks of 32 along head_dim with llama.cpp's Q4_0 arithmetic:
d = m / -8 in float32 (m: the signed value of largest magnitude), code =
trunc(x * (1 / d) + 8.5) clipped to 0..15 (all 16 codes), d stored as
float16 rounded to nearest.
quantize -> dequantize equals gguf-py's quants.quantize -> quants.dequantize
element for element (tests/quant/test_ggml_exact.py). int4, scheme=symmetric,
rounding='ggml'; no full-precision residual, every token committed to the
quantized cache as it is written (flush_block 1).

Measured: (to be filled by the lead)

Run: python -m experiments.run --config=q4_0
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=4, group_size=32,
                      scale_dtype='float16', rounding='ggml')
  c.cache.v = base.kv(type='int', bits=4, group_size=32,
                      scale_dtype='float16', rounding='ggml')
  c.cache.residual = 0
  c.cache.flush_block = 1
  return c
