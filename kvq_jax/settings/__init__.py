"""The boundary between configs and code: frozen settings from a config.

* `presets`: preset names and paths -> `configs/NAME.py`, `load_preset`.
* `experiment_settings`: `ExperimentSettings` (and its parts) from a
  ConfigDict, every field checked.
* `short_specs`: compact format names (`int4_g32_asym`) <-> `QuantSpec`,
  per-layer override text, a whole cache `KSPEC[/VSPEC][:OPT...]`.
* `kinds`: a cache kind by name (dense dtype, preset or short spec): the
  one resolver every tool uses.
"""
