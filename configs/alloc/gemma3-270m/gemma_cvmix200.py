"""gemma_cvmix200: issue 34's "<= 2.0 bits" row on Gemma 3 270M (18 layers, 1
kv head of 256; layers 5, 11, 17 global, the rest sliding-window 512): ca's
keys (a width per native pre-RoPE channel, no scale) with their calibrated
shift and scale held in float16, and values among int4_vq / int3_lm /
int2_vq / int1_vq with a bfloat16 or an 8-bit float8_e5m2 scale per vector
(`_se5m2`), chosen by `experiments.allocate` (KL objective, budget 2
effective bits at 512 tokens with every constant charged, 1.9997 achieved,
predicted KL +0.2478) from one-layer probes on the LAST 2 windows of the
text (runs/issue34d/gemma_sens16). Per layer (K/V): L0 int2_st/int2_vq, L1
int3_st/int2_vq, L2 int3_st/int2_vq, L3 int2_st/int2_vq_se5m2, L4
int2_st/int2_vq, L5 int2_st/int1_vq, L6 int2_st/int1_vq_se5m2, L7
int2_st/int1_vq, L8 int2_st/int2_vq, L9 int2_st/int1_vq, L10
int2_st/int2_vq, L11 int2_st/int2_vq, L12 int2_st/int2_vq, L13
int2_st/int2_vq, L14 int2_st/int1_vq_se5m2, L15 int2_st/int2_vq, L16
int2_st/int1_vq, L17 int2_st/int1_vq_se5m2.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34d/gemma_verify, one
baseline pass, PPL 17.40): dPPL +4.07 [+3.66, +4.49], KL 0.2160 ± 0.0050,
top-1 0.754; effective 1.98 bits at 512 tokens, 1.82 at 4096 (stored 1.89).
Paired in the same run against the preset it replaces (`git show
66f5ac1:configs/alloc/gemma3-270m/gemma_cvmix200.py`, +4.35 [+3.97, +4.75]): ΔNLL −0.0129 ±
0.0059 nats (z −2.2), KL −0.0144 ± 0.0025 (z −5.7) (WORKSPACE.md "Gemma 3
and Qwen re-allocated").

Regenerate: as gemma_cvmix250 (the same table, runs/issue34d/gemma_sens16)
with --budget=2. Run: python -m experiments.run --config=gemma_cvmix200
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,4,8,10,11,12,13,15:int2_st/int2_vq;'
      '1,2:int3_st/int2_vq;'
      '3:int2_st/int2_vq_se5m2;'
      '5,7,9,16:int2_st/int1_vq;'
      '6,14,17:int2_st/int1_vq_se5m2',
      key_affine_dtype="float16")
  c.model = "gemma3-270m"
  c.made_for = "gemma3-270m"
  return c
