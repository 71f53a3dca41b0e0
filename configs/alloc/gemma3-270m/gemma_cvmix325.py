"""gemma_cvmix325: issue 34's "<= 3.25 bits" row on Gemma 3 270M (18 layers, 1
kv head of 256; layers 5, 11, 17 global, the rest sliding-window 512): ca's
keys (a width per native pre-RoPE channel, no scale) with their calibrated
shift and scale held in float16, and values among int4_vq / int3_lm /
int2_vq / int1_vq with a bfloat16 or an 8-bit float8_e5m2 scale per vector
(`_se5m2`), chosen by `experiments.allocate` (KL objective, budget 3.25
effective bits at 512 tokens with every constant charged, 3.2499 achieved,
predicted KL +0.0429) from one-layer probes on the LAST 2 windows of the
text (runs/issue34d/gemma_sens16). Per layer (K/V): L0 int3_st/int3_lm, L1
int4_st/int4_vq, L2 int4_st/int3_lm, L3 int4_st/int4_vq, L4 int3_st/int3_lm,
L5 int3_st/int3_lm_se5m2, L6 int3_st/int3_lm_se5m2, L7
int3_st/int3_lm_se5m2, L8 int3_st/int4_vq_se5m2, L9 int3_st/int3_lm_se5m2,
L10 int3_st/int3_lm, L11 int3_st/int4_vq_se5m2, L12 int3_st/int3_lm_se5m2,
L13 int3_st/int3_lm_se5m2, L14 int3_st/int3_lm_se5m2, L15
int3_st/int3_lm_se5m2, L16 int2_st/int2_vq_se5m2, L17 int3_st/int2_vq_se5m2.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34d/gemma_verify, one
baseline pass, PPL 17.40): dPPL +0.69 [+0.55, +0.82], KL 0.0409 ± 0.0011,
top-1 0.889; effective 3.23 bits at 512 tokens, 3.11 at 4096 (stored 3.13).
Paired in the same run against the preset it replaces (`git show
66f5ac1:configs/alloc/gemma3-270m/gemma_cvmix325.py`, +0.78 [+0.63, +0.94]): ΔNLL −0.0054 ±
0.0029 nats (z −1.9, no measurable change), KL −0.0040 ± 0.0009 (z −4.5)
(results/below_3.5_bits.md "Gemma 3 and Qwen re-allocated").

Regenerate: as gemma_cvmix250 (the same table, runs/issue34d/gemma_sens16)
with --budget=3.25. Run: python -m experiments.run --config=gemma_cvmix325
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,4,10:int3_st/int3_lm;'
      '1,3:int4_st/int4_vq;'
      '2:int4_st/int3_lm;'
      '5,6,7,9,12,13,14,15:int3_st/int3_lm_se5m2;'
      '8,11:int3_st/int4_vq_se5m2;'
      '16:int2_st/int2_vq_se5m2;'
      '17:int3_st/int2_vq_se5m2',
      key_affine_dtype="float16")
  c.model = "gemma3-270m"
  c.made_for = "gemma3-270m"
  return c
