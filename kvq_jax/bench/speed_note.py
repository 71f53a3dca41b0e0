"""One line on why the memory-bound speed model and the measurement differ."""

from __future__ import annotations

# Relative disagreement below which the two figures are said to agree.
AGREEMENT = 0.2


def speed_note(model_speedup: float, measured_speedup: float,
               machine: str) -> str:
  """Explains `measured` beside the memory-bound `model` (both quant/base)."""
  text = (f"decode speed-up: memory-bound model {model_speedup:.2f}x, "
          f"measured {measured_speedup:.2f}x on {machine}")
  if abs(measured_speedup - model_speedup) <= AGREEMENT * model_speedup:
    return text + "; they agree within 20%."
  if measured_speedup < model_speedup:
    return text + (
        ". The model assumes a decode step costs the bytes it reads (an "
        "accelerator at long context); here the step is bound by compute "
        "(unpacking and dequantizing codes, a small model at a short "
        "context), so fewer bytes do not make it faster.")
  return text + (
      ". The measurement beats the model: the step is cheaper than its byte "
      "count suggests here (e.g. less work on the smaller cache, or the "
      "baseline is slowed by something the model ignores).")
