"""qwen_cvmix425: issue 34's "<= 4.25 bits" row on Qwen2.5-Coder-0.5B (24
layers, 2 kv heads of 64): ca's keys (a width per native pre-RoPE channel,
no scale) and values among int4_vq / int3_lm / int2_vq / int1_vq, chosen by
`experiments.allocate` (KL objective, budget 4.25 effective bits at 512
tokens with every constant charged, 4.2443 achieved, predicted KL +0.0136)
from one-layer probes on the LAST window of the text: K int3_st in layer 0,
int4_st elsewhere; V int3_lm in layer 5, int4_vq elsewhere.

Verified as qwen_cvmix325 (the same sweep):
4.24 effective bits @512 (4.08 stored), dPPL −0.10 [−0.27, +0.07]
(no measurable change), KL 0.0140, top-1 0.933; against ca4 (4.28 bits
here, over the budget) ΔNLL +0.0020 ± 0.0028 nats, no measurable change
(WORKSPACE.md "Qwen2.5-Coder-0.5B: allocated presets").

Regenerate: as qwen_cvmix325 (the same two tables) with --budget=4.25.
Run: python -m experiments.run --config=qwen_cvmix425
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0:int3_st/int4_vq;'
      '1,2,3,4,6,7,8,9,10,11,12,'
      '13,14,15,16,17,18,19,20,21,22,23:int4_st/int4_vq;'
      '5:int4_st/int3_lm')
  c.model = "qwen2.5-coder-0.5b"
  return c
