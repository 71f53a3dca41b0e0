"""cvmix250: issue 34's "<= 2.5 bits" row on SmolLM2-135M-Instruct: ca's
keys (int4_st / int3_st / int2_st per layer: a width per native pre-RoPE
channel, no scale) with their calibrated shift and scale held in float16,
and values among int4_vq / int3_lm / int2_vq (after the randomised
Hadamard) with a bfloat16 or an 8-bit float8_e5m2 scale per vector
(`_se5m2`), chosen by `experiments.allocate` (KL objective, budget 2.5
effective bits at 512 tokens with every constant charged, 2.4997
achieved, predicted KL +0.119) from one-layer probes on the LAST 2
windows of the text (runs/issue34c/smol_sens16): K int2_st in layers 0,
11, 12, 14-17, 19, 21-23, 25-29, int4_st in 24, int3_st elsewhere; V
int4_vq (bfloat16 scale) in layer 1, int3_lm_se5m2 in 0, 2, 11, 18,
int2_vq_se5m2 elsewhere.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, one core of the 2-core CPU, sweep runs/issue34c/smol_verify, one
baseline pass): dPPL +3.99 [+3.55, +4.45] against baseline PPL 23.5115,
KL 0.157 ± 0.004, top-1 0.781 ± 0.003; effective 2.50 bits at 512
tokens, 2.43 at 4096 (stored 2.41). Paired in the same run against the
preset it replaces (`git show 036d497:configs/alloc/smollm2-135m/cvmix250.py`, +4.35): ΔNLL
−0.0130 ± 0.0040 nats (z −3.2), KL −0.0206 ± 0.0022 (z −9.5). With the
values' random Hadamard signs drawn from seeds 1 and 2 instead of 0
(runs/issue34c/smol_verify_seeds): +3.60 and +3.91 (the replaced preset
+4.32 and +4.72); over the three seeds +3.83 against +4.46, paired
−0.0228 ± 0.0029 nats, KL −0.0203 ± 0.0014. Which part bought what:
results/below_3.5_bits.md "Fewer bits for the constants".

Regenerate: experiments.layer_sensitivity --config=ca3 --from_end
--noall_but_one --config.eval.num_windows=2
--config.cache.key_affine_dtype=float16 --k_formats=int4_st,int2_st
--v_formats=int4_vq,int2_vq,int1_vq,int4_vq_se5m2,int3_lm_se5m2,int2_vq_se5m2,int1_vq_se5m2,
then experiments.allocate --metric=kl_mean
--k_formats=int4_st,int3_st,int2_st --v_formats=(the seven above and
int3_lm) --budget=2.5. Key statistics: ca3's, built on first use and
cached. Run: python -m experiments.run --config=cvmix250
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,11:int2_st/int3_lm_se5m2;'
      '1:int3_st/int4_vq;'
      '2,18:int3_st/int3_lm_se5m2;'
      '3,4,5,6,7,8,9,10,13,20:int3_st/int2_vq_se5m2;'
      '12,14,15,16,17,19,21,22,23,25,26,27,28,29:int2_st/int2_vq_se5m2;'
      '24:int4_st/int2_vq_se5m2', key_affine_dtype='float16')
  c.made_for = "smollm2-135m"
  return c
