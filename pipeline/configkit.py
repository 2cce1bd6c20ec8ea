"""Strict conversion of plain data (YAML, JSON, form values) into the config dataclasses, and its error type.

A leaf module: it imports nothing of the project, so every stage's config (``pipeline/<stage>/config.py``) and the
composite :mod:`pipeline.config` build on it without import circles.  Field metadata (``_f(...)``) carries the
title, description, choices and bounds; :func:`_build` checks them and raises :class:`ConfigError` naming the
dotted field (``train.mode``) and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the dotted field."""


def _f(default: Any = dataclasses.MISSING, *, desc: str = "", choices: tuple | None = None,
       ge: float | None = None, le: float | None = None, factory: Any = None) -> Any:
    meta = {"desc": desc, "choices": choices, "ge": ge, "le": le}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, where: str, meta: dict) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if origin in (list,):
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return [_convert(v, item_tp, f"{where}[{i}]", {}) for i, v in enumerate(value)]
    if origin in (types.UnionType, typing.Union):
        raise ConfigError(f"{where}: union types are not supported")  # pragma: no cover - schema bug
    if tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        return copy.deepcopy(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        value = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
    else:  # pragma: no cover - schema bug
        raise ConfigError(f"{where}: unsupported type {_type_name(tp)}")
    choices, ge, le = meta.get("choices"), meta.get("ge"), meta.get("le")
    if choices and value not in choices:
        raise ConfigError(f"{where}: must be one of {list(choices)}, got {value!r}")
    if ge is not None and value < ge:
        raise ConfigError(f"{where}: must be >= {ge}, got {value!r}")
    if le is not None and value > le:
        raise ConfigError(f"{where}: must be <= {le}, got {value!r}")
    return value


def _build(cls: type, data: Any, where: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"{prefix}{unknown[0]}: unknown field (allowed: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, f in fields.items():
        path = f"{where}.{name}" if where else name
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], path, dict(f.metadata))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{path}: required field is missing")
    return cls(**kwargs)

