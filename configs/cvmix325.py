"""cvmix325: issue 34's "<= 3.25 bits" row on SmolLM2-135M-Instruct: ca3's
keys (pre-RoPE, a width per native channel, no scale; int3_st, 3 bits per
channel on average) in every layer, and values chosen per layer by
`experiments.allocate` (KL objective, budget 3.25 effective bits at 512
tokens with every constant charged, 3.2445 achieved, predicted KL
+0.0585) among int4_vq, int3_lm and int2_vq from one-layer probes on the
LAST 2 windows of the text: int4_vq in layers 1, 2, 11, 23; int2_vq in
7, 8, 25, 26; int3_lm elsewhere.

Measured (WikiText-2 test, first 40 windows x 512, second-half scoring,
float32, 2-core CPU, sweep runs/issue34/verify_vq2, one baseline pass):
dPPL +1.458 [+1.183, +1.736] against baseline PPL 23.5115, KL 0.0715 ±
0.0020, top-1 0.850 ± 0.004; effective 3.244 bits at 512 tokens, 3.140 at
4096 (stored 3.125). Paired in the same run: ΔNLL −0.0307 ± 0.0051 nats
against kqmix325 (z −6.0) and −0.0094 ± 0.0038 against ca3 (z −2.5).
At 4096 tokens (runs/issue34/agreement_cv, 8 prompts) decode KL 0.073 ±
0.006 against kqmix325's 0.148 ± 0.026; on the passkey grid at 2048/4096
(runs/issue34/passkey_cv, 24 prompts) it answers 16 against kqmix325's
19, none of the 6 with the key at 0-25% depth at 4096.

Allocated from key probes that ran int4_st/int2_st as bare uniform codes
(fixed in 7d4b06d). Re-allocated from the fixed probes (runs/issue34b,
WORKSPACE.md "Probes that measure what runs"): +1.55 at 3.25 bits, paired
+0.0036 ± 0.0046 nats against this preset, no measurable change; kept.

Regenerate: experiments.layer_sensitivity --config=ca3 --from_end
--noall_but_one --config.eval.num_windows=2 --k_formats=int4_st,int2_st
--v_formats=int2_vq,int4_vq, then experiments.allocate --metric=kl_mean
--k_formats=int4_st,int3_st,int2_st --v_formats=int4_vq,int3_lm,int2_vq
--budget=3.25 (WORKSPACE.md "Vector-quantized values"). Key statistics:
ca3's, built on first use and cached. Run: python -m experiments.run
--config=cvmix325 --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  return base.channel_widths_mix(
      '1,2,11,23:int3_st/int4_vq;7,8,25,26:int3_st/int2_vq')
