"""The `memq` command. Each command group lives in its own module, named in COMMANDS below."""

from __future__ import annotations

import faulthandler
import importlib
import signal

import click

from memq import __version__
from memq.cli._common import CliState, MemqGroup

#: Command name -> "module:attribute". A command's module is imported when it runs (or when help
#: lists the commands): every `memq` process and every broker started through it paid about a
#: second of CPU importing all of them (aiohttp, boto3, the clients) before doing anything.
COMMANDS = {
    "dev": "memq.cli.dev:dev", "topic": "memq.cli.topic:topic", "produce": "memq.cli.produce:produce",
    "consume": "memq.cli.consume:consume", "schema": "memq.cli.schema:schema", "get": "memq.cli.get:get",
    "broker": "memq.cli.broker:broker", "status": "memq.cli.status:status",
    "governor": "memq.cli.governor:governor", "audit": "memq.cli.audit:audit", "table": "memq.cli.table:table",
    "cost": "memq.cli.cost:cost", "token": "memq.cli.security:token", "acl": "memq.cli.security:acl",
}


class LazyGroup(MemqGroup):
    """memq's top-level group: its commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="MEMQ_CONFIG",
              help="TOML config file (also MEMQ_CONFIG); MEMQ_SECTION_FIELD variables override it.")
@click.version_option(__version__, prog_name="memq")
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """memq: batches on S3, pointers on Kafka. Start with `memq dev`."""
    # `kill -USR1 <pid>` prints every thread's stack to stderr: what a command that does not end is doing.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    ctx.obj = CliState(config_path)
