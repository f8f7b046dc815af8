"""What every `memq` command shares: the config (file + MEMQ_* environment) and errors.

A bad or missing setting ends the command with exit code 2 and a message naming the
setting; any other memq failure ends it with exit code 1 and the error's message, never a
traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import click

from memq.config import MemqConfig, load_config
from memq.errors import ConfigError, MemqError


class ConfigProblem(click.ClickException):
    """A setting is missing or bad: exit code 2, like a usage error."""

    exit_code = 2


@dataclass
class CliState:
    """Per-invocation state: the config file named by `--config` (or MEMQ_CONFIG)."""

    config_path: str | None
    _config: MemqConfig | None = field(default=None, repr=False)

    @property
    def config(self) -> MemqConfig:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config


class MemqGroup(click.Group):
    """A click group that turns memq errors into clean exits."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except ConfigError as e:
            raise ConfigProblem(str(e)) from None
        except MemqError as e:
            raise click.ClickException(f"{type(e).__name__}: {e}") from None


def config_of(ctx: click.Context) -> MemqConfig:
    """The loaded config of this invocation."""
    return ctx.find_object(CliState).config  # type: ignore[union-attr]


def require(value: str, setting: str, flag: str) -> str:
    """`value`, or a ConfigError naming the setting and how to provide it."""
    if not value:
        env = "MEMQ_" + setting.replace(".", "_").upper()
        raise ConfigError(f"{setting} is not set: use {flag}, [{setting.split('.')[0]}] "
                          f"{setting.split('.')[1]} in the config file, or {env}")
    return value
