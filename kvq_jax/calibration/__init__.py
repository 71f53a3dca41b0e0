"""Learned per-layer clip ratios for the quantized KV cache (optax)."""

from kvq_jax.calibration.optimize import (CalibrationOptions, LayerClip,
                                          learn_clip_ratios, learn_layer_clip)
from kvq_jax.calibration.preset import clip_layer_overrides, write_preset
from kvq_jax.calibration.recording import (LayerRecord, RecordingLayerCache,
                                           record_qkv)
from kvq_jax.calibration.store import (ClipRatios, load_clip_ratios,
                                       save_clip_ratios)
from kvq_jax.calibration.windows import split_windows

__all__ = [
    "CalibrationOptions", "ClipRatios", "LayerClip", "LayerRecord",
    "RecordingLayerCache", "clip_layer_overrides", "learn_clip_ratios",
    "learn_layer_clip", "load_clip_ratios", "record_qkv", "save_clip_ratios",
    "split_windows", "write_preset",
]
