"""`memq broker --config FILE`: run one broker in this process until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import logging

import click

from memq.cli._common import CliState, config_of
from memq.cli.governor import drain, undrain


@click.group(invoke_without_command=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML config file (same as `memq --config FILE broker`).")
@click.pass_context
def broker(ctx: click.Context, config_path: str | None) -> None:
    """Run one broker; on a signal it seals, stores and acks what it holds, then exits.

    `memq broker drain ID` / `undrain ID`: move a governed broker's topics away (rolling restarts).
    """
    from memq.broker.__main__ import serve  # the broker pulls in aiohttp and storage: load on use

    if config_path is not None:
        ctx.find_object(CliState).config_path = config_path  # type: ignore[union-attr]
    if ctx.invoked_subcommand is not None:
        return
    config = config_of(ctx)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(config))


broker.add_command(drain)
broker.add_command(undrain)
