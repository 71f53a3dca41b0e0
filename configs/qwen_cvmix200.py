"""qwen_cvmix200: issue 34's "2.0 bits" row on Qwen2.5-Coder-0.5B (24 layers, 2
kv heads of 64): ca's keys (a width per native pre-RoPE channel, no scale)
and values among int4_vq / int3_lm / int2_vq / int1_vq, chosen by
`experiments.allocate` (KL objective, budget 2.0 effective bits at 512
tokens with every constant charged, 1.9995 achieved, predicted KL +0.253)
from one-layer probes on the LAST window of the text: K int2_st everywhere;
V int2_vq in layers 0, 1, 2, 8, 10, 14, 16, 17, 19, 21, 23, int1_vq
elsewhere.

Verified as qwen_cvmix325 (the same sweep):
2.00 effective bits @512 (1.85 stored), dPPL +2.62 [+1.71, +3.55],
KL 0.306, top-1 0.704
(WORKSPACE.md "Qwen2.5-Coder-0.5B: allocated presets").

Regenerate: as qwen_cvmix325 (the same two tables) with --budget=2.0.
Run: python -m experiments.run --config=qwen_cvmix200
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,1,2,8,10,14,16,17,19,21,23:int2_st/int2_vq;'
      '3,4,5,6,7,9,11,12,13,15,18,20,22:int2_st/int1_vq')
  c.model = "qwen2.5-coder-0.5b"
  return c
