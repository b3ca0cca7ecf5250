"""Loads a config class from the command line: TOML files (`@`), `TIDAL_` variables, flags.

Sources merge as layers (`merge`) in increasing precedence, pydantic validates once, and its
errors become one `ConfigError` (`errors`); `--help [SECTION]` and `--dry-run` stop before
anything starts. Hand-written, not pydantic-settings: its deep-merged sources, argparse
command line and plain pydantic errors would save a few lines here and lose tagged-section
replacement, the bare-flag check and the key-naming messages (docs/config.md).
"""

from __future__ import annotations

import os
import sys
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import tomli_w
from pydantic import BaseModel, ConfigDict, ValidationError

from tidal.common.config.errors import describe_error
from tidal.common.config.help import help_text
from tidal.common.config.merge import check_bare_flags, flag_layer, merge_layer
from tidal.common.errors import ConfigError

ENV_PREFIX = "TIDAL_"
HELP_PREAMBLE = """\
Every key below is set in a TOML file (`key = value` under its [table]) or by a flag
(`--table.key value`, with `-` and `_` alike). A flag without a value sets a boolean key
to true; any other key needs a value. `TIDAL_TABLE__KEY=value` sets it from the
environment. Defaults are shown as TOML values."""

C = TypeVar("C", bound="BaseConfig")


class BaseConfig(BaseModel):
    """Base of every config section: strict keys, docstrings as help."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_default=True, frozen=False
    )
    moved_keys: typing.ClassVar[dict[str, str]] = {}
    """Removed key → the full name of the key that replaced it (named in the error)."""
    moved_keys_until: typing.ClassVar[str] = ""
    """The date (YYYY-MM-DD) after which `moved_keys` is deleted, named in the error."""


@dataclass
class ParsedArgs:
    """The command line split into its parts, before any validation."""

    files: list[Path] = field(default_factory=list)
    overrides: list[tuple[str, str | None]] = field(default_factory=list)
    """(dotted key as typed, raw value); None for a flag given without a value."""
    dry_run: bool = False
    help: str | None = None
    """None without `--help`; "" for `--help` alone; else its argument (a section, `all`)."""


def _value_after(argv: Sequence[str], i: int) -> str | None:
    """The token after `argv[i]` when it is a value, not the next flag or file."""
    return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith(("--", "@")) else None


def split_argv(argv: Sequence[str]) -> ParsedArgs:
    """Split `@ file`, `@file`, `--key value`, `--key=value`, `--flag`, `--dry-run`,
    `--help [SECTION]`."""
    parsed = ParsedArgs()
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "@":
            if i + 1 >= len(argv):
                raise ConfigError("'@' must be followed by a TOML file path")
            parsed.files.append(Path(argv[i + 1]))
            i += 2
        elif token.startswith("@"):
            parsed.files.append(Path(token[1:]))
            i += 1
        elif token in ("--dry-run",):
            parsed.dry_run = True
            i += 1
        elif token.startswith("--"):
            key, eq, raw = token[2:].partition("=")
            if not key:
                raise ConfigError(f"empty option name in {token!r}")
            value = raw if eq else _value_after(argv, i)
            i += 1 if eq or value is None else 2
            if key == "help":
                parsed.help = value or ""
            else:
                parsed.overrides.append((key, value))
        elif token == "-h":
            parsed.help = ""
            i += 1
        else:
            raise ConfigError(
                f"unexpected argument {token!r}: use '@ file.toml' for config files and "
                "'--section.key value' for overrides"
            )
    return parsed


def parse_literal(raw: str) -> Any:
    """Parse a CLI/env string as a TOML value, falling back to the string itself."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def env_overrides(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """`TIDAL_ENDPOINTS__TRAINER=host:port` → ("endpoints.trainer", "host:port")."""
    out: list[tuple[str, str | None]] = []
    for name, value in sorted(environ.items()):
        if name.startswith(ENV_PREFIX) and "__" in name:
            out.append((name[len(ENV_PREFIX) :].lower().replace("__", "."), value))
    return out


def compose(
    cls: type[BaseModel], parsed: ParsedArgs, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Merge files, env and overrides into one raw dict for `cls` (not yet validated)."""
    data: dict[str, Any] = {}
    for path in parsed.files:
        data = merge_layer(cls, data, read_toml(path))
    environ = os.environ if environ is None else environ
    data = merge_layer(cls, data, flag_layer(env_overrides(environ), parse_literal))
    data = merge_layer(cls, data, flag_layer(parsed.overrides, parse_literal))
    check_bare_flags(cls, data, parsed.overrides)
    return data


def validate(cls: type[C], data: Mapping[str, Any]) -> C:
    """Validate raw data into `cls`, turning pydantic's errors into one readable ConfigError."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        lines = [describe_error(cls, err) for err in exc.errors()]
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def to_toml(config: BaseModel) -> str:
    """The resolved config as TOML (None values omitted, since TOML has no null)."""
    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))


def load_config(
    cls: type[C], argv: Sequence[str], *, environ: Mapping[str, str] | None = None
) -> tuple[C, ParsedArgs]:
    """Parse argv into a validated config. Raises ConfigError with an actionable message."""
    parsed = split_argv(argv)
    if parsed.help is not None:
        return cls(), parsed
    return validate(cls, compose(cls, parsed, environ)), parsed


def load_or_exit(cls: type[C], argv: Sequence[str], *, usage: str) -> C:
    """CLI entry: `--help [SECTION]` prints keys, `--dry-run` the resolved TOML; errors exit 2."""
    try:
        config, parsed = load_config(cls, argv)
        keys = None if parsed.help is None else help_text(cls, parsed.help)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if keys is not None:
        preamble = f"{HELP_PREAMBLE}\n\n" if parsed.help in ("", "all") else ""
        print(f"usage: {usage}\n\n{preamble}{keys}")
        raise SystemExit(0)
    if parsed.dry_run:
        print(to_toml(config), end="")
        raise SystemExit(0)
    return config
