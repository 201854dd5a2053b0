"""Typed configuration from a TOML file, environment variables and command-line overrides.

Every server in the project (ledger node, nameserver, broker) describes its settings as a
dataclass; this module fills one from layered sources so that each server gets the same
precedence rules and the same error messages: defaults < TOML file < environment < CLI.
Errors always name the offending key and the source it came from, because a user staring
at a refused start-up needs to know which line to fix.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting is missing, unknown or has the wrong type; the message names the key."""


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(key: str, value: Any, typ: Any, source: str) -> Any:
    """Convert ``value`` to ``typ``; strings from env/CLI are parsed, TOML values are checked."""
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("", "none", "null")):
            if type(None) in args:
                return None
        return _coerce(key, value, non_none[0], source)
    if origin in (list, tuple):
        inner = args[0] if args else str
        if isinstance(value, str):
            items: Iterable[Any] = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, list | tuple):
            items = value
        else:
            raise ConfigError(f"{source}: key '{key}' must be a list, got {type(value).__name__}")
        out = [_coerce(key, v, inner, source) for v in items]
        return tuple(out) if origin is tuple else out
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{source}: key '{key}' must be true or false, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"{source}: key '{key}' must be an integer, got {value!r}")
        if isinstance(value, int):
            return value
        try:
            return int(str(value), 0)
        except ValueError:
            raise ConfigError(f"{source}: key '{key}' must be an integer, got {value!r}") from None
    if typ is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        try:
            return float(str(value))
        except ValueError:
            raise ConfigError(f"{source}: key '{key}' must be a number, got {value!r}") from None
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{source}: key '{key}' must be a string, got {value!r}")
    return value


def load_settings(
    cls: type[T],
    path: str | Path | None = None,
    *,
    env_prefix: str = "",
    overrides: Mapping[str, Any] | None = None,
    section: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> T:
    """Build ``cls`` from defaults, then the TOML file, then ``{env_prefix}{KEY}`` variables, then overrides.

    ``section`` selects a table of the TOML file (e.g. ``[broker]``); unknown keys are refused
    rather than ignored, because a misspelt key silently falling back to a default is the
    hardest kind of configuration bug to find.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    types_by_name = _field_types(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}

    if path is not None:
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {p} is not UTF-8 text (byte {exc.start}): is it the right file?"
            ) from None
        except OSError as exc:  # a directory, no permission, an I/O error
            raise ConfigError(f"config file {p} cannot be read: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p}: invalid TOML: {exc}") from None
        if section is not None:
            raw = raw.get(section, raw)
        for key, value in raw.items():
            name = key.replace("-", "_")
            if name not in names:
                raise ConfigError(f"config file {p}: unknown key '{key}' (known: {', '.join(sorted(names))})")
            values[name] = _coerce(key, value, types_by_name[name], f"config file {p}")

    env = os.environ if environ is None else environ
    if env_prefix:
        for name in names:
            var = env_prefix + name.upper()
            if var in env:
                values[name] = _coerce(name, env[var], types_by_name[name], f"environment variable {var}")

    for key, value in (overrides or {}).items():
        if value is None:
            continue
        name = key.replace("-", "_")
        if name not in names:
            raise ConfigError(f"command line: unknown setting '{key}'")
        values[name] = _coerce(key, value, types_by_name[name], "command line")

    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
    ]
    if missing:
        raise ConfigError(f"missing required setting(s): {', '.join(missing)}")
    obj = cls(**values)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def parse_host_port(key: str, value: str) -> tuple[str, int]:
    """Split ``host:port``; the error names the setting so a typo in a peer list is easy to find."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"key '{key}': expected host:port, got {value!r}")
    return host, int(port)
