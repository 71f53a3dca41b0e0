"""qwen_cvmix325: issue 34's "<= 3.25 bits" row on Qwen2.5-Coder-0.5B (24
layers, 2 kv heads of 64): ca's keys (a width per native pre-RoPE channel,
no scale) with their calibrated shift and scale held in float16, and values
among int4_vq / int3_lm / int2_vq / int1_vq with a bfloat16 or an 8-bit
float8_e5m2 scale per vector (`_se5m2`), chosen by `experiments.allocate`
(KL objective, budget 3.25 effective bits at 512 tokens with every constant
charged, 3.2488 achieved, predicted KL +0.0439) from one-layer probes on the
LAST window of the text (runs/issue34d/qwen_sens16). Per layer (K/V): L0
int2_st/int3_lm, L1 int3_st/int3_lm_se5m2, L2 int3_st/int3_lm_se5m2, L3
int3_st/int3_lm_se5m2, L4 int3_st/int2_vq_se5m2, L5 int3_st/int3_lm_se5m2,
L6 int3_st/int3_lm_se5m2, L7 int3_st/int3_lm_se5m2, L8 int4_st/int4_vq, L9
int3_st/int3_lm_se5m2, L10 int3_st/int3_lm_se5m2, L11 int3_st/int2_vq_se5m2,
L12 int3_st/int3_lm_se5m2, L13 int3_st/int3_lm_se5m2, L14
int3_st/int3_lm_se5m2, L15 int3_st/int3_lm_se5m2, L16 int3_st/int3_lm_se5m2,
L17 int3_st/int3_lm_se5m2, L18 int3_st/int3_lm_se5m2, L19
int4_st/int3_lm_se5m2, L20 int3_st/int3_lm_se5m2, L21 int3_st/int3_lm_se5m2,
L22 int4_st/int3_lm, L23 int4_st/int4_vq.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34d/qwen_verify, one
baseline pass, PPL 31.84): dPPL +0.03 [−0.28, +0.34] (no measurable change),
KL 0.0478 ± 0.0015, top-1 0.876; effective 3.25 bits at 512 tokens, 3.15 at
4096 (stored 3.14). Paired in the same run against the preset it replaces
(`git show 66f5ac1:configs/alloc/qwen2.5-coder-0.5b/qwen_cvmix325.py`, +0.22 [−0.07, +0.52]): ΔNLL
−0.0061 ± 0.0037 nats (z −1.7, no measurable change), KL −0.0041 ± 0.0010 (z
−4.2) (results/below_3.5_bits.md "Gemma 3 and Qwen re-allocated").

Regenerate: as qwen_cvmix250 (the same table, runs/issue34d/qwen_sens16)
with --budget=3.25. Run: python -m experiments.run --config=qwen_cvmix325
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0:int2_st/int3_lm;'
      '1,2,3,5,6,7,9,10,12,13,14,15,16,17,18,20,21:int3_st/int3_lm_se5m2;'
      '4,11:int3_st/int2_vq_se5m2;'
      '8,23:int4_st/int4_vq;'
      '19:int4_st/int3_lm_se5m2;'
      '22:int4_st/int3_lm',
      key_affine_dtype="float16")
  c.model = "qwen2.5-coder-0.5b"
  c.made_for = "qwen2.5-coder-0.5b"
  return c
