"""qwen_cvmix250: issue 34's "<= 2.5 bits" row on Qwen2.5-Coder-0.5B (24
layers, 2 kv heads of 64): ca's keys (a width per native pre-RoPE channel,
no scale) and values among int4_vq / int3_lm / int2_vq / int1_vq, chosen by
`experiments.allocate` (KL objective, budget 2.5 effective bits at 512
tokens with every constant charged, 2.4995 achieved, predicted KL +0.117)
from one-layer probes on the LAST window of the text: K int3_st in layers 2,
3, 8, 13, 17, 21, 23, int2_st elsewhere; V int3_lm in 1, 2, 8, 21, 23,
int2_vq elsewhere.

Verified as qwen_cvmix325 (the same sweep):
2.50 effective bits @512 (2.38 stored), dPPL +0.88 [+0.40, +1.37],
KL 0.132, top-1 0.803
(WORKSPACE.md "Qwen2.5-Coder-0.5B: allocated presets").

Regenerate: as qwen_cvmix325 (the same two tables) with --budget=2.5.
Run: python -m experiments.run --config=qwen_cvmix250
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,4,5,6,7,9,10,11,12,14,15,16,18,19,20,22:int2_st/int2_vq;'
      '1:int2_st/int3_lm;'
      '2,8,21,23:int3_st/int3_lm;'
      '3,13,17:int3_st/int2_vq')
  c.model = "qwen2.5-coder-0.5b"
  return c
