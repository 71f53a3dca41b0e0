"""llama.cpp's KV-cache perplexities, the reference points of the sweep plot.

The numbers quoted in issue 5: llama.cpp perplexity with each cache type
(`-ctk/-ctv`; the last row is K q8_0 + V q4_0) on 40 windows of 512 tokens
of WikiText-2 raw test, the same windows a sweep with
`--eval_data=.../wiki.test.raw --config.eval.num_windows=40` scores. Bits
per element include the block scales (q8_0: 34 bytes per 32 values). They
are plotted as delta PPL against llama.cpp's own f16 cache.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ReferencePoint:
  name: str
  bits_per_element: float
  ppl: float


LLAMA_CPP_F16_PPL = 23.578
LLAMA_CPP_PROTOCOL = "llama.cpp, WikiText-2, 40 windows of 512"

LLAMA_CPP_POINTS = (
    ReferencePoint("f16", 16.0, 23.578),
    ReferencePoint("q8_0", 8.5, 23.582),
    ReferencePoint("q5_1", 6.0, 24.055),
    ReferencePoint("q5_0", 5.5, 24.399),
    ReferencePoint("q4_1", 5.0, 25.454),
    ReferencePoint("iq4_nl", 4.5, 25.774),
    ReferencePoint("q4_0", 4.5, 27.805),
    ReferencePoint("K q8_0 + V q4_0", 6.5, 23.831),
)


def llama_cpp_delta_ppl(point: ReferencePoint) -> float:
  """The point's PPL minus llama.cpp's own f16 cache PPL."""
  return point.ppl - LLAMA_CPP_F16_PPL
