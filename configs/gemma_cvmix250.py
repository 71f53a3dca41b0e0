"""gemma_cvmix250: issue 34's "<= 2.5 bits" row on Gemma 3 270M (18 layers,
1 kv head of 256; layers 5, 11, 17 global, the rest sliding-window 512):
ca's keys (a width per native pre-RoPE channel, no scale) and values among
int4_vq / int3_lm / int2_vq / int1_vq, chosen by `experiments.allocate`
(KL objective, budget 2.5 effective bits at 512 tokens with every
constant charged, 2.4997 achieved, predicted KL +0.119) from one-layer
probes on the LAST 2 windows of the text, extra key formats probed as the
layer stores them (fixed in 7d4b06d): K int4_st in layer 1, int3_st in 0,
2, 3, 4, 8, 10, 11, int2_st elsewhere; V int3_lm in 1, 8, 11, int2_vq
elsewhere.

Verified on 40 x 512 windows (runs/issue34b/gemma_verify, one core,
baseline PPL 17.40): 2.48 effective bits @512 (2.36 stored), dPPL +1.71
[+1.52, +1.91], KL 0.103, top-1 0.827. Against the allocation made from
the uniform key probes (`git show de6b39c:configs/gemma_cvmix250.py`,
+2.60, runs/issue34/gemma_verify; the same windows, ca4's per-window
losses identical in both runs): ΔNLL −0.0454 ± 0.0061 nats (z −7.5)
(WORKSPACE.md "Probes that measure what runs").

Regenerate: experiments.layer_sensitivity --config=ca3 --model=gemma3-270m
--from_end --noall_but_one --config.eval.num_windows=2
--k_formats=int4_st,int2_st, and again with
--v_formats=int4_vq,int2_vq,int1_vq; then experiments.allocate
--metric=kl_mean over both tables with --k_formats=int4_st,int3_st,int2_st
--v_formats=int4_vq,int3_lm,int2_vq,int1_vq --budget=2.5. Key
statistics: ca3's for Gemma 3, built on first use and cached. Run:
python -m experiments.run --config=gemma_cvmix250
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0,2,3,4,10:int3_st/int2_vq;'
      '1:int4_st/int3_lm;'
      '5,6,7,9,12,13,14,15,16,17:int2_st/int2_vq;'
      '8,11:int3_st/int3_lm')
  c.model = "gemma3-270m"
  return c
