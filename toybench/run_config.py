"""A run config's ``algo`` section for the toy regime (``dapo toy check --config``, ``dapo toy
suite --config``): read from a YAML file, or from a bundled preset (``scale/configs/NAME.yaml``,
read as a data file: the toy regime imports nothing of ``scale/``). Light: the parsers name the
presets in their help without importing torch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dapo.cliargs import UsageError
from dapo.config import AlgoConfig, ConfigError, from_dict


def preset_dirs() -> list[Path]:
    """Where the bundled presets lie (``scale/configs``), found without importing ``scale``."""

    spec = importlib.util.find_spec("scale")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return [Path(r) / "configs" for r in roots]


def presets() -> list[str]:
    """The bundled presets' names."""
    return sorted({p.stem for d in preset_dirs() for p in d.glob("*.yaml")})


def load_algo(name_or_path: str, option: str = "--config") -> AlgoConfig:
    """The ``algo`` section of a run config: a YAML file, or the name of a bundled preset
    (``scale/configs/NAME.yaml``, read as a data file: the toy regime imports nothing of
    ``scale/``). :class:`UsageError` names the file and the field."""
    try:
        import yaml
    except ImportError:
        raise UsageError(f"{option}: reading a config needs PyYAML (pip install -e '.[gate]')") from None
    path = Path(name_or_path)
    if not path.is_file():
        found = [d / f"{name_or_path}.yaml" for d in preset_dirs()]
        path = next((p for p in found if p.is_file()), path)
    if not path.is_file():
        raise UsageError(f"{option} {name_or_path!r}: no such file, nor a bundled preset")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UsageError(
            f"{option} {path}: not readable as YAML ({' '.join(str(e).split())[:200]})"
        ) from None
    algo = values.get("algo", {}) if isinstance(values, dict) else None
    if not isinstance(algo, dict):
        raise UsageError(f"{option} {path}: its algo section is not a mapping")
    try:
        return from_dict(algo, source=f"{path}: algo")
    except ConfigError as e:
        raise UsageError(f"{option} {path}: algo.{e}") from None
