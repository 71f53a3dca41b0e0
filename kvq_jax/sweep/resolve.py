"""The presets an experiment compares with its baseline: `--points` on top
of the base preset, or the base preset itself (passkey, agreement,
HumanEval). `check_points` parses `--points` before the model loads;
`resolve_points` resolves them against the loaded model."""

from __future__ import annotations

from typing import Sequence

from kvq_jax.models.config import ModelConfig
from kvq_jax.settings.experiment_settings import ExperimentSettings
from kvq_jax.sweep.grid import SweepPoint
from kvq_jax.sweep.points import parse_points
from kvq_jax.sweep.runner import unique_points


def check_points(settings: ExperimentSettings,
                 points: str | Sequence[str] | None) -> None:
  """Raises ValueError for a bad `points` without the model: every item
  parsed on top of the base preset and names checked for clashes, as
  `resolve_points` does; only the check against the model's head_dim and
  layers waits for it. Call before loading the model, so a typo fails at
  once."""
  if points:
    unique_points(parse_points(points, settings.cache_spec, head_dim=None,
                               num_layers=None))


def resolve_points(settings: ExperimentSettings, config_name: str,
                   points: str | Sequence[str] | None,
                   model_config: ModelConfig) -> list[SweepPoint]:
  """The presets to compare with the baseline, resolved as the sweep does.

  With `points`, every item is parsed by `sweep.points.parse_points` on top
  of the base preset's cache settings (duplicates evaluated once, a name
  clash refused); without, the base preset itself (named `config_name`),
  or nothing when it does not quantize (baseline only).
  """
  if points:
    return unique_points(parse_points(
        points, settings.cache_spec, head_dim=model_config.head_dim,
        num_layers=model_config.num_layers))
  if settings.quantize and settings.cache_spec is not None:
    return [SweepPoint(config_name, settings.cache_spec, source="preset")]
  return []
