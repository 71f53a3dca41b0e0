"""Sweeps over KV-cache formats: grid, named points, Pareto front, plot."""

from kvq_jax.sweep.grid import Skipped, SweepPoint, expand_grid
from kvq_jax.sweep.pareto import pareto_front
from kvq_jax.sweep.points import parse_points

__all__ = ["Skipped", "SweepPoint", "expand_grid", "pareto_front",
           "parse_points"]
