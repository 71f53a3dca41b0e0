"""llama.cpp q5_0 K and V (-ctk q5_0 -ctv q5_0): 5.5 bits/element, bit-exact values.

Blocks of 32 along head_dim with llama.cpp's Q5_0 arithmetic:
d = m / -16 in float32 (m: the signed value of largest magnitude), code =
trunc(x * (1 / d) + 16.5) clipped to 0..31 (all 32 codes), d stored as
float16 rounded to nearest.
quantize -> dequantize equals gguf-py's quants.quantize -> quants.dequantize
element for element (tests/quant/test_ggml_exact.py). int5, scheme=symmetric,
rounding='ggml'; no full-precision residual, every token committed to the
quantized cache as it is written (flush_block 1).

Measured: (to be filled by the lead)

Run: python -m experiments.run --config=q5_0
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.get_config()
  c.cache.k = base.kv(type='int', bits=5, group_size=32,
                      scale_dtype='float16', rounding='ggml')
  c.cache.v = base.kv(type='int', bits=5, group_size=32,
                      scale_dtype='float16', rounding='ggml')
  c.cache.residual = 0
  c.cache.flush_block = 1
  return c
