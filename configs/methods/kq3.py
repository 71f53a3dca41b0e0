"""kq3: K int3 static codes in calibrated per-channel ranges (the 1st and
99th percentiles) before RoPE plus the largest normalised key value of each
head vector kept in bfloat16 with its index (dense-and-sparse), V int3
Lloyd-Max codes + one bfloat16 scale per head vector after a randomised
Hadamard, the first token in bfloat16 (`configs/base.py`
`static_keys_config`). Stored 3.3125 bits/element.

Measured (SmolLM2-135M-Instruct, WikiText-2 test, first 40 windows x 512,
second-half scoring, float32, 2-core CPU; sweep `runs/issue14/sweep_kq`,
results/rotations_and_codebooks.md "Rotations, Lloyd-Max codebooks and calibrated keys", its
static-keys table): dPPL +2.159 [+1.873,
+2.449] against baseline PPL 23.5115, KL 0.0803 ± 0.0030, top-1 0.8386 ±
0.0036; effective 3.401 bits at 512 tokens, 3.323 at 4096. tq3 in the same
run: +2.804 at 3.315 bits, KL 0.1053.

Key ranges: built on first use for the model being run and cached
(`cache.key_stats = 'auto:mode=range...'`: the last 4 windows of the
text, disjoint from the evaluation; `kvq_jax/calibration/auto_key_stats.py`),
the same as this command writes explicitly (15 s):
  python -m experiments.calibrate_keys --config=kq3 --mode=range \\
      --range_quantile=0.99 --workdir=runs/key_stats/smollm2-135m-range0.99 \\
      --config.eval.num_windows=40 \\
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Run: python -m experiments.run --config=kq3 \\
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  return base.static_keys_config(3, 3, "auto:mode=range,range_quantile=0.99",
                                 k_outliers=1)
