"""qwen_cvmix200: issue 34's "<= 2.0 bits" row on Qwen2.5-Coder-0.5B (24
layers, 2 kv heads of 64): ca's keys (a width per native pre-RoPE channel,
no scale) with their calibrated shift and scale held in float16, and values
among int4_vq / int3_lm / int2_vq / int1_vq with a bfloat16 or an 8-bit
float8_e5m2 scale per vector (`_se5m2`), chosen by `experiments.allocate`
(KL objective, budget 2 effective bits at 512 tokens with every constant
charged, 1.9994 achieved, predicted KL +0.2184) from one-layer probes on the
LAST window of the text (runs/issue34d/qwen_sens16). Per layer (K/V): L0
int2_st/int2_vq_se5m2, L1 int2_st/int2_vq, L2 int2_st/int2_vq_se5m2, L3
int2_st/int1_vq_se5m2, L4 int2_st/int1_vq_se5m2, L5 int2_st/int1_vq_se5m2,
L6 int2_st/int1_vq_se5m2, L7 int2_st/int2_vq, L8 int2_st/int2_vq, L9
int2_st/int1_vq_se5m2, L10 int2_st/int2_vq_se5m2, L11 int2_st/int1_vq_se5m2,
L12 int2_st/int2_vq_se5m2, L13 int2_st/int1_vq_se5m2, L14
int2_st/int2_vq_se5m2, L15 int2_st/int1_vq_se5m2, L16 int2_st/int2_vq_se5m2,
L17 int2_st/int2_vq_se5m2, L18 int2_st/int1_vq_se5m2, L19
int2_st/int2_vq_se5m2, L20 int2_st/int2_vq_se5m2, L21 int2_st/int2_vq, L22
int2_st/int2_vq_se5m2, L23 int2_st/int2_vq_se5m2.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34d/qwen_verify, one
baseline pass, PPL 31.84): dPPL +1.74 [+0.94, +2.57], KL 0.2721 ± 0.0057,
top-1 0.714; effective 2.00 bits at 512 tokens, 1.90 at 4096 (stored 1.89).
Paired in the same run against the preset it replaces (`git show
66f5ac1:configs/alloc/qwen2.5-coder-0.5b/qwen_cvmix200.py`, +2.62 [+1.71, +3.55]): ΔNLL −0.0258 ±
0.0065 nats (z −4.0), KL −0.0337 ± 0.0029 (z −11.8) (WORKSPACE.md "Gemma 3
and Qwen re-allocated").

Regenerate: as qwen_cvmix250 (the same table, runs/issue34d/qwen_sens16)
with --budget=2. Run: python -m experiments.run --config=qwen_cvmix200
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,2,10,12,14,16,17,19,20,22,23:int2_st/int2_vq_se5m2;'
      '1,7,8,21:int2_st/int2_vq;'
      '3,4,5,6,9,11,13,15,18:int2_st/int1_vq_se5m2',
      key_affine_dtype="float16")
  c.model = "qwen2.5-coder-0.5b"
  c.made_for = "qwen2.5-coder-0.5b"
  return c
