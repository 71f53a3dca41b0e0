"""`--config=NAME` resolution: a preset name, a path, or `path:arg`.

`DEFINE_config_file` from ml_collections expects a file path; researchers
type preset names (`--config=int4_g32`). `DEFINE_preset_config` accepts both:
a bare name resolves to `configs/NAME.py` (the `configs` package shipped
beside `kvq_jax`; `settings.presets`), anything else is used as a path. Overrides stay
ml_collections' own (`--config.cache.k.bits=8`), and the config is locked, so
an unknown key fails at parse time.
"""

from __future__ import annotations

from absl import flags
from ml_collections.config_flags import config_flags
from ml_collections.config_flags import config_path

from kvq_jax.settings.presets import resolve_config_path


class _PresetParser(config_flags.ConfigFileFlagParser):

  def parse(self, path):
    return super().parse(resolve_config_path(path))


def _unknown_fields(config, paths) -> list[str]:
  unknown = []
  for path in paths:
    try:
      config_path.get_value(path, config)
    except (AttributeError, KeyError, IndexError, ValueError):
      unknown.append(path)
  return unknown


class _PresetConfigFlag(config_flags._ConfigFlag):  # pylint: disable=protected-access
  """ml_collections' config flag; an unknown override is a flag error.

  ml_collections lets the AttributeError of a locked ConfigDict escape flag
  parsing as a traceback; here it becomes `flags.IllegalFlagValueError`,
  which absl reports as "Flags parsing error: ..." naming the bad field.
  """

  def _parse(self, argument):
    try:
      return super()._parse(argument)
    except (AttributeError, KeyError) as e:
      overrides = self._GetOverrides(self._GetArgv())
      unknown = _unknown_fields(self.parser.parse(argument), overrides)
      names = ", ".join(f"--{self.name}.{p}" for p in unknown) or str(e)
      raise flags.IllegalFlagValueError(
          f"unknown config field in {names}: the config is locked, so an "
          "override must name an existing field (see configs/base.py for "
          "the fields).") from e


def DEFINE_preset_config(name: str = "config", default: str | None = None,
                         help_string: str = "preset name or config file",
                         flag_values: flags.FlagValues = flags.FLAGS,
                         sys_argv: list[str] | None = None):
  """Like config_flags.DEFINE_config_file(..., lock_config=True), plus names.

  `sys_argv` (default: sys.argv at parse time) is where ml_collections looks
  for the `--NAME.field=value` overrides; pass the argv you parse when it is
  not sys.argv (tests).
  """
  flag = _PresetConfigFlag(
      parser=_PresetParser(name=name, lock_config=True),
      serializer=flags.ArgumentSerializer(), name=name, default=default,
      help_string=help_string, flag_values=flag_values,
      accept_new_attributes=False, sys_argv=sys_argv)
  return flags.DEFINE_flag(flag, flag_values)


def preset_name(flag: str = "config") -> str:
  """The preset's short name as given (`int4_g32` for `--config=int4_g32` or
  `--config=configs/formats/int4_g32.py`), for run names and reports."""
  value = flags.FLAGS[flag].serialize().split("=", 1)[-1]
  return value.rsplit("/", 1)[-1].removesuffix(".py")
