"""qwen_cvmix325: issue 34's "<= 3.25 bits" row on Qwen2.5-Coder-0.5B (24
layers, 2 kv heads of 64): ca's keys (a width per native pre-RoPE channel,
no scale) and values among int4_vq / int3_lm / int2_vq / int1_vq, chosen by
`experiments.allocate` (KL objective, budget 3.25 effective bits at 512
tokens with every constant charged, 3.2476 achieved, predicted KL +0.0471)
from one-layer probes on the LAST window of the text: K int2_st in layer 0,
int4_st in 8, 19, 23, int3_st elsewhere; V int2_vq in 3-6, 11, int4_vq in 8,
23, int3_lm elsewhere.

Verified in one sweep on 40 x 512 windows: runs/issue34b/qwen_verify,
baseline PPL 31.84, one core of the 2-core CPU:
3.25 effective bits @512 (3.10 stored), dPPL +0.22 [−0.07, +0.52]
(no measurable change in perplexity), KL 0.0519, top-1 0.870
(WORKSPACE.md "Qwen2.5-Coder-0.5B: allocated presets").

Regenerate (WORKSPACE.md "Qwen2.5-Coder-0.5B: allocated presets"):
experiments.layer_sensitivity --config=ca3 --model=qwen2.5-coder-0.5b
--from_end --noall_but_one --config.eval.num_windows=1
--k_formats=int4_st,int2_st, and again with
--v_formats=int4_vq,int2_vq,int1_vq; then experiments.allocate
--metric=kl_mean over both tables with --k_formats=int4_st,int3_st,int2_st
--v_formats=int4_vq,int3_lm,int2_vq,int1_vq --budget=3.25. Key
statistics: ca3's for this model, built on first use and cached. Run:
python -m experiments.run --config=qwen_cvmix325
--eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  c = base.channel_widths_mix(
      '0:int2_st/int3_lm;'
      '1,2,7,9,10,12,13,14,15,16,17,18,20,21,22:int3_st/int3_lm;'
      '3,4,5,6,11:int3_st/int2_vq;'
      '8,23:int4_st/int4_vq;'
      '19:int4_st/int3_lm')
  c.model = "qwen2.5-coder-0.5b"
  return c
