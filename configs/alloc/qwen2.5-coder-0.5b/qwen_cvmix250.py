"""qwen_cvmix250: issue 34's "<= 2.5 bits" row on Qwen2.5-Coder-0.5B (24
layers, 2 kv heads of 64): ca's keys (a width per native pre-RoPE channel,
no scale) with their calibrated shift and scale held in float16, and values
among int4_vq / int3_lm / int2_vq / int1_vq with a bfloat16 or an 8-bit
float8_e5m2 scale per vector (`_se5m2`), chosen by `experiments.allocate`
(KL objective, budget 2.5 effective bits at 512 tokens with every constant
charged, 2.4994 achieved, predicted KL +0.1061) from one-layer probes on the
LAST window of the text (runs/issue34d/qwen_sens16). Per layer (K/V): L0
int2_st/int2_vq_se5m2, L1 int2_st/int3_lm_se5m2, L2 int3_st/int3_lm_se5m2,
L3 int3_st/int2_vq_se5m2, L4 int2_st/int2_vq_se5m2, L5
int2_st/int2_vq_se5m2, L6 int2_st/int2_vq_se5m2, L7 int3_st/int2_vq, L8
int3_st/int3_lm, L9 int2_st/int2_vq_se5m2, L10 int2_st/int2_vq_se5m2, L11
int2_st/int2_vq_se5m2, L12 int2_st/int2_vq_se5m2, L13 int3_st/int2_vq_se5m2,
L14 int3_st/int2_vq_se5m2, L15 int2_st/int2_vq_se5m2, L16
int2_st/int2_vq_se5m2, L17 int3_st/int2_vq_se5m2, L18 int2_st/int2_vq_se5m2,
L19 int3_st/int2_vq_se5m2, L20 int3_st/int2_vq_se5m2, L21
int3_st/int3_lm_se5m2, L22 int3_st/int2_vq_se5m2, L23 int2_st/int3_lm_se5m2.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34d/qwen_verify, one
baseline pass, PPL 31.84): dPPL +0.40 [−0.12, +0.92] (no measurable change),
KL 0.1167 ± 0.0026, top-1 0.810; effective 2.50 bits at 512 tokens, 2.41 at
4096 (stored 2.40). Paired in the same run against the preset it replaces
(`git show 66f5ac1:configs/alloc/qwen2.5-coder-0.5b/qwen_cvmix250.py`, +0.88 [+0.40, +1.37]): ΔNLL
−0.0148 ± 0.0061 nats (z −2.4), KL −0.0150 ± 0.0019 (z −8.1) (WORKSPACE.md
"Gemma 3 and Qwen re-allocated").

Regenerate: experiments.layer_sensitivity --config=ca3
--model=qwen2.5-coder-0.5b --from_end --noall_but_one
--config.eval.num_windows=1 --config.cache.key_affine_dtype=float16
--k_formats=int4_st,int2_st
--v_formats=int4_vq,int2_vq,int1_vq,int4_vq_se5m2,int3_lm_se5m2,int2_vq_se5m2,int1_vq_se5m2
(runs/issue34d/qwen_sens16), then experiments.allocate --metric=kl_mean
--k_formats=int4_st,int3_st,int2_st
--v_formats=int4_vq,int3_lm,int2_vq,int1_vq,int4_vq_se5m2,int3_lm_se5m2,int2_vq_se5m2,int1_vq_se5m2
--budget=2.5. Key statistics: ca3's for this model, built on first use and
cached. Run: python -m experiments.run --config=qwen_cvmix250
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,4,5,6,9,10,11,12,15,16,18:int2_st/int2_vq_se5m2;'
      '1,23:int2_st/int3_lm_se5m2;'
      '2,21:int3_st/int3_lm_se5m2;'
      '3,13,14,17,19,20,22:int3_st/int2_vq_se5m2;'
      '7:int3_st/int2_vq;'
      '8:int3_st/int3_lm',
      key_affine_dtype="float16")
  c.model = "qwen2.5-coder-0.5b"
  c.made_for = "qwen2.5-coder-0.5b"
  return c
