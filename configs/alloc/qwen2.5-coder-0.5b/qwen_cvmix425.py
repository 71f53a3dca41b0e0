"""qwen_cvmix425: issue 34's "<= 4.25 bits" row on Qwen2.5-Coder-0.5B (24
layers, 2 kv heads of 64): ca's keys (a width per native pre-RoPE channel,
no scale) with their calibrated shift and scale held in float16, and values
among int4_vq / int3_lm / int2_vq / int1_vq with a bfloat16 or an 8-bit
float8_e5m2 scale per vector (`_se5m2`), chosen by `experiments.allocate`
(KL objective, budget 4.25 effective bits at 512 tokens with every constant
charged, 4.2474 achieved, predicted KL +0.0132) from one-layer probes on the
LAST window of the text (runs/issue34d/qwen_sens16). Per layer (K/V): L0
int4_st/int4_vq, L1 int4_st/int4_vq, L2 int4_st/int4_vq, L3 int4_st/int4_vq,
L4 int4_st/int4_vq, L5 int4_st/int4_vq_se5m2, L6 int4_st/int4_vq_se5m2, L7
int4_st/int4_vq, L8 int4_st/int4_vq, L9 int4_st/int4_vq, L10
int4_st/int4_vq, L11 int4_st/int4_vq_se5m2, L12 int4_st/int4_vq, L13
int4_st/int4_vq, L14 int4_st/int4_vq, L15 int4_st/int4_vq, L16
int4_st/int4_vq, L17 int4_st/int4_vq, L18 int4_st/int4_vq, L19
int4_st/int4_vq, L20 int4_st/int4_vq, L21 int4_st/int4_vq, L22
int4_st/int4_vq, L23 int4_st/int4_vq.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34d/qwen_verify, one
baseline pass, PPL 31.84): dPPL −0.19 [−0.36, −0.01], KL 0.0127 ± 0.0004,
top-1 0.937; effective 4.25 bits at 512 tokens, 4.13 at 4096 (stored 4.12).
Paired in the same run against the preset it replaces (`git show
66f5ac1:configs/alloc/qwen2.5-coder-0.5b/qwen_cvmix425.py`, −0.10 [−0.27, +0.07]): ΔNLL −0.0027 ±
0.0028 nats (z −1.0, no measurable change), KL −0.0014 ± 0.0003 (z −4.3)
(results/below_3.5_bits.md "Gemma 3 and Qwen re-allocated").

Regenerate: as qwen_cvmix250 (the same table, runs/issue34d/qwen_sens16)
with --budget=4.25. Run: python -m experiments.run --config=qwen_cvmix425
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,1,2,3,4,7,8,9,10,12,13,14,15,16,17,18,19,20,21,22,23:int4_st/int4_vq;'
      '5,6,11:int4_st/int4_vq_se5m2',
      key_affine_dtype="float16")
  c.model = "qwen2.5-coder-0.5b"
  c.made_for = "qwen2.5-coder-0.5b"
  return c
