"""ca3: keys at 3 bits per element on average with a width per native
channel (issue 34: transform coding's allocation without its basis), V
int3 Lloyd-Max codes + one bfloat16 scale per head vector after a
randomised Hadamard, the first token in bfloat16 (`configs/base.py`
`channel_widths_config`).

Keys before RoPE, each channel centred and scaled by its calibration mean
and std, 192 bits per key vector spread over its 64 channels (0..8 bits
each) by the calibrated query-weighted error tables, one codebook per
width, no scale, no rotation. Key statistics: built on first use for the
model being run and cached (`cache.key_stats = 'auto:mode=transform'`:
the last 4 windows of the text, disjoint from the evaluation), as
  python -m experiments.calibrate_keys --config=ca3 --mode=transform \\
      --workdir=runs/key_stats/smollm2-ca --config.eval.num_windows=40 \\
      --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw

Measured on SmolLM2-135M-Instruct (first 40 windows of 512 of WikiText-2
test, second half scored; sweep `runs/issue34/sweep_alloc`, the command in
results/below_3.5_bits.md "Transform coding of keys", as `int3_st/int3_lm` under
`--config=tc3 --config.cache.key_stats=auto:mode=transform`): 3.24
effective bits per element at 512 tokens, 3.14 at 4096 (stored 3.125),
dPPL +1.72 [+1.38, +2.07] against the float32 cache, KL 0.0764
(other sweeps on the same windows: tc3 +1.61 at 3.79 / 3.21 bits, kq3 +2.19
at 3.40, kqmix325 +2.33 at 3.24).

Run: python -m experiments.run --config=ca3 \\
  --eval_data=../shared/data/wikitext-2-raw/wiki.test.raw
"""

from __future__ import annotations

from configs import base


def get_config():
  return base.channel_widths_config(3, 3)
