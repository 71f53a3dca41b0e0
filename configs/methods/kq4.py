"""kq4: K int4 static codes in calibrated per-channel ranges before RoPE
(KVQuant-style: no scale per token), V int4 Lloyd-Max codes + one bfloat16
scale per head vector after a randomised Hadamard, the first token (the
attention sink) in bfloat16 (`configs/base.py` `static_keys_config`).
Stored 4.125 bits/element.

Measured (SmolLM2-135M-Instruct, WikiText-2 test, first 40 windows x 512,
second-half scoring, float32, 2-core CPU; sweep `runs/issue14/sweep_kq`,
results/rotations_and_codebooks.md "Rotations, Lloyd-Max codebooks and calibrated keys", its
static-keys table): dPPL +0.680 [+0.537,
+0.823] against baseline PPL 23.5115, KL 0.0273 ± 0.0008, top-1 0.9024 ±
0.0035; effective 4.213 bits at 512 tokens, 4.136 at 4096 (the sink token,
key ranges and codebook charged). tq4 in the same run: +0.546 at 4.317.

Key ranges: built on first use for the model being run and cached
(`cache.key_stats = 'auto:mode=range...'`: the last 4 windows of the
text, disjoint from the evaluation; `kvq_jax/calibration/auto_key_stats.py`),
the same as this command writes explicitly (15 s):
  python -m experiments.calibrate_keys --config=kq4 --mode=range \\
      --workdir=runs/key_stats/smollm2-135m-range \\
      --config.eval.num_windows=40 \\
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Run: python -m experiments.run --config=kq4 \\
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  return base.static_keys_config(4, 4, "auto:mode=range")
