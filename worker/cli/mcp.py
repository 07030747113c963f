"""`grounded mcp`: the MCP tools over stdio, for desktop agents that start their servers as commands.

It talks to Redis directly, as the other batch commands do, and acts as the CLI's tenant. stdout
carries the protocol, so nothing else may print there; problems go to stderr.
"""

from __future__ import annotations

from typing import Annotated

import typer


def register(cli: typer.Typer) -> None:
    @cli.command("mcp")
    def mcp(
        tenant: Annotated[str | None, typer.Option(help="tenant the tools act as (default GROUNDED_CLI_TENANT)")] = None,
    ) -> None:
        """Serve the MCP tools (ask, search, submit_batch, batch_status, batch_results) over stdio."""
        from worker.interfaces.mcp_server import constant_tenant, create_mcp_server
        from worker.jobs.served import BrokenConfig
        from worker.producer import Producer
        from worker.settings import get_settings

        settings = get_settings()
        producer = Producer(settings)
        try:
            producer.check_served_configs()
        except BrokenConfig as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        create_mcp_server(producer, constant_tenant(tenant or settings.cli_tenant)).run("stdio")
