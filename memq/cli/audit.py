"""`memq audit`: run the auditor and its dashboard until interrupted."""

from __future__ import annotations

import asyncio

import click

from memq.cli._common import config_of


@click.command()
@click.option("--db", "db_path", type=click.Path(dir_okay=False),
              help="SQLite file of the books (default: [audit] db_path).")
@click.option("--host", default=None, help="Dashboard address (default: [audit] http_host).")
@click.option("--port", type=int, default=None, help="Dashboard port (default: [audit] http_port; 0 = any).")
@click.pass_context
def audit(ctx: click.Context, db_path: str | None, host: str | None, port: int | None) -> None:
    """Balance the books of the cluster's audit topic and serve the dashboard."""
    from memq.audit.dashboard import AuditService

    service = AuditService(config_of(ctx), db_path=db_path, host=host, port=port)

    async def run() -> None:
        url = await service.start()
        click.echo(f"audit dashboard: {url}  (metrics: {url}metrics; Ctrl-C stops)")
        try:
            await asyncio.Event().wait()
        finally:
            await service.stop()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
