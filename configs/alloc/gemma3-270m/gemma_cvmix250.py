"""gemma_cvmix250: issue 34's "<= 2.5 bits" row on Gemma 3 270M (18 layers, 1
kv head of 256; layers 5, 11, 17 global, the rest sliding-window 512): ca's
keys (a width per native pre-RoPE channel, no scale) with their calibrated
shift and scale held in float16, and values among int4_vq / int3_lm /
int2_vq / int1_vq with a bfloat16 or an 8-bit float8_e5m2 scale per vector
(`_se5m2`), chosen by `experiments.allocate` (KL objective, budget 2.5
effective bits at 512 tokens with every constant charged, 2.4936 achieved,
predicted KL +0.1140) from one-layer probes on the LAST 2 windows of the
text (runs/issue34d/gemma_sens16). Per layer (K/V): L0 int3_st/int2_vq, L1
int4_st/int3_lm, L2 int3_st/int2_vq, L3 int3_st/int2_vq_se5m2, L4
int3_st/int3_lm, L5 int2_st/int2_vq, L6 int2_st/int2_vq, L7
int2_st/int2_vq_se5m2, L8 int3_st/int3_lm, L9 int2_st/int2_vq, L10
int3_st/int2_vq, L11 int3_st/int3_lm, L12 int2_st/int2_vq, L13
int2_st/int2_vq, L14 int2_st/int2_vq_se5m2, L15 int2_st/int2_vq, L16
int2_st/int2_vq, L17 int2_st/int2_vq.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34d/gemma_verify, one
baseline pass, PPL 17.40): dPPL +1.68 [+1.54, +1.83], KL 0.0983 ± 0.0021,
top-1 0.830; effective 2.47 bits at 512 tokens, 2.41 at 4096 (stored 2.39).
Paired in the same run against the preset it replaces (`git show
66f5ac1:configs/alloc/gemma3-270m/gemma_cvmix250.py`, +1.71 [+1.52, +1.91]): ΔNLL −0.0015 ±
0.0031 nats (z −0.5, no measurable change), KL −0.0045 ± 0.0010 (z −4.3)
(results/below_3.5_bits.md "Gemma 3 and Qwen re-allocated").

Regenerate: experiments.layer_sensitivity --config=ca3 --model=gemma3-270m
--from_end --noall_but_one --config.eval.num_windows=2
--config.cache.key_affine_dtype=float16 --k_formats=int4_st,int2_st
--v_formats=int4_vq,int2_vq,int1_vq,int4_vq_se5m2,int3_lm_se5m2,int2_vq_se5m2,int1_vq_se5m2
(runs/issue34d/gemma_sens16), then experiments.allocate --metric=kl_mean
--k_formats=int4_st,int3_st,int2_st
--v_formats=int4_vq,int3_lm,int2_vq,int1_vq,int4_vq_se5m2,int3_lm_se5m2,int2_vq_se5m2,int1_vq_se5m2
--budget=2.5. Key statistics: ca3's for this model, built on first use and
cached. Run: python -m experiments.run --config=gemma_cvmix250
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,2,10:int3_st/int2_vq;'
      '1:int4_st/int3_lm;'
      '3:int3_st/int2_vq_se5m2;'
      '4,8,11:int3_st/int3_lm;'
      '5,6,9,12,13,15,16,17:int2_st/int2_vq;'
      '7,14:int2_st/int2_vq_se5m2',
      key_affine_dtype="float16")
  c.model = "gemma3-270m"
  c.made_for = "gemma3-270m"
  return c
