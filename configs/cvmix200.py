"""cvmix200: issue 34's "2.0 bits" row on SmolLM2-135M-Instruct: ca's keys
(int3_st or int2_st per layer: a width per native pre-RoPE channel, no
scale) and vector-coded values (int2_vq or int1_vq: one 8-bit index per 4
or 8 elements after the randomised Hadamard, a bfloat16 scale per
vector), chosen by `experiments.allocate` (KL objective, budget 2.0
effective bits at 512 tokens with every constant charged, 1.9999
achieved, predicted KL +0.528) from one-layer probes on the LAST 2
windows of the text: V int2_vq in layers 0, 1, int1_vq elsewhere; K
int3_st in 0, 1, 2, 3, 5, 8, 14, 17, 18, 20, 23, 24, 28, int2_st
elsewhere.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU, sweep runs/issue34/verify_low, one baseline pass):
dPPL +24.3 [+22.6, +26.1] against baseline PPL 23.51, KL 0.688, top-1
0.553; effective 2.00 bits at 512 tokens (stored 1.88). A 2-bit row, not
a usable cache: 1-bit values cost far more than the additive probes
predicted.

Regenerate: experiments.layer_sensitivity --config=ca3 --from_end
--noall_but_one --config.eval.num_windows=2 --k_formats=int2_st
--v_formats=int2_vq,int1_vq, then experiments.allocate --metric=kl_mean
--k_formats=int3_st,int2_st --v_formats=int3_lm,int2_vq,int1_vq
--budget=2.0 (WORKSPACE.md "One-bit vector codes and the 2.0-bit row").
Run: python -m experiments.run --config=cvmix200
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  return base.channel_widths_mix(
      '0,1:int3_st/int2_vq;'
      '2,3,5,8,14,17,18,20,23,24,28:int3_st/int1_vq;'
      '4,6,7,9,10,11,12,13,15,16,19,21,22,25,26,27,29:int2_st/int1_vq')
