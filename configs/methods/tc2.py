"""tc2: transform-coded keys at 2 bits per element on average (issue 34),
V int2 Lloyd-Max codes + one bfloat16 scale per head vector after a
randomised Hadamard, the first token in bfloat16 (`configs/base.py`
`transform_keys_config`).

Keys before RoPE in the weighted principal axes of the calibration keys
(one basis per layer and kv head, stored as int8 rows with a float32
scale per row), centred and scaled per component, 128 bits per key
vector spread over its 64 components (0..8 bits each) by the calibrated
error tables, one codebook per width, no scale. Key statistics: built on
first use for the model being run and cached (`cache.key_stats =
'auto:mode=transform,rotation=pca'`: the last 4 windows of the text,
disjoint from the evaluation), as
  python -m experiments.calibrate_keys --config=tc2 --mode=transform \\
      --rotation=pca --workdir=runs/key_stats/smollm2-tc-pca \\
      --config.eval.num_windows=40 \\
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Measured on SmolLM2-135M-Instruct (first 40 windows of 512 of WikiText-2
test, second half scored; one sweep, the command in WORKSPACE.md "Transform
coding of keys"): 2.77 effective bits per element at 512 tokens, 2.21 at
4096 (stored 2.125; the rest is the basis, codebooks and sink token), dPPL
+9.11 [+8.33, +9.91] against the float32 cache, KL 0.336.

Run: python -m experiments.run --config=tc2 \\
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  return base.transform_keys_config(2, 2)
