"""The `memq` command. Each command group lives in its own module and is registered below."""

from __future__ import annotations

import click

from memq import __version__
from memq.cli._common import CliState, MemqGroup
from memq.cli.audit import audit
from memq.cli.broker import broker
from memq.cli.consume import consume
from memq.cli.cost import cost
from memq.cli.dev import dev
from memq.cli.get import get
from memq.cli.governor import governor
from memq.cli.produce import produce
from memq.cli.schema import schema
from memq.cli.security import acl, token
from memq.cli.status import status
from memq.cli.table import table
from memq.cli.topic import topic


@click.group(cls=MemqGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), envvar="MEMQ_CONFIG",
              help="TOML config file (also MEMQ_CONFIG); MEMQ_SECTION_FIELD variables override it.")
@click.version_option(__version__, prog_name="memq")
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """memq: batches on S3, pointers on Kafka. Start with `memq dev`."""
    ctx.obj = CliState(config_path)


main.add_command(dev)
main.add_command(topic)
main.add_command(produce)
main.add_command(consume)
main.add_command(schema)
main.add_command(get)
main.add_command(broker)
main.add_command(status)
main.add_command(governor)
main.add_command(audit)
main.add_command(table)
main.add_command(cost)
main.add_command(token)
main.add_command(acl)
