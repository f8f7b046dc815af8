"""`memq schema register|list|show|delete|check|config`: the schema registry every broker serves
(docs/guides/schemas.md), through the brokers named in `producer.brokers`, with the client's
credentials. A topic's checks are settings of the topic: `memq topic alter NAME --set
value_schema_validation=true` (and `schema_validation_action`, the subject name strategies)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click

from memq.cli._common import config_of
from memq.client.schemas import SchemaClient, subject_path
from memq.errors import ConfigError

TYPES = ("AVRO", "JSON", "PROTOBUF")


def _client(ctx: click.Context) -> SchemaClient:
    return SchemaClient(config_of(ctx).producer)


def _echo(answer: object) -> None:
    click.echo(json.dumps(answer, indent=2))


def _schema_body(path: str, schema_type: str, references: tuple[str, ...]) -> dict[str, object]:
    refs = []
    for r in references:
        name, _, where = r.partition("=")
        subject, _, version = where.rpartition(":")
        if not (name and subject and version.lstrip("-").isdigit()):
            raise ConfigError(f"--reference {r!r}: NAME=SUBJECT:VERSION")
        refs.append({"name": name, "subject": subject, "version": int(version)})
    body: dict[str, object] = {"schema": Path(path).read_text(), "schemaType": schema_type}
    if refs:
        body["references"] = refs
    return body


@click.group()
def schema() -> None:
    """Register, list, show, check and delete schemas in the brokers' registry."""


def _schema_file(command: Callable[..., None]) -> Callable[..., None]:
    """SUBJECT FILE [--type] [--reference ...]: a schema as register and check take it."""
    for decorator in reversed((
            click.argument("subject"), click.argument("file", type=click.Path(exists=True, dir_okay=False)),
            click.option("--type", "schema_type", type=click.Choice(TYPES, case_sensitive=False), default="AVRO",
                         show_default=True),
            click.option("--reference", "references", multiple=True, help="NAME=SUBJECT:VERSION (repeatable)."))):
        command = decorator(command)
    return command


@schema.command()
@_schema_file
@click.option("--normalize", is_flag=True, help="Store the normalised text.")
@click.pass_context
def register(ctx: click.Context, subject: str, file: str, schema_type: str, references: tuple[str, ...],
             normalize: bool) -> None:
    """Register FILE's schema under SUBJECT; prints its id."""
    answer = _client(ctx).call("POST", f"/subjects/{subject_path(subject)}/versions",
                               _schema_body(file, schema_type.upper(), references), normalize=normalize)
    click.echo(f"{subject}: id {answer['id']}")


@schema.command(name="list")
@click.option("--prefix", default="", help="Only subjects starting with this.")
@click.option("--deleted", is_flag=True, help="Soft-deleted subjects too.")
@click.pass_context
def list_(ctx: click.Context, prefix: str, deleted: bool) -> None:
    """Subjects and their versions."""
    client = _client(ctx)
    for subject in client.call("GET", "/subjects", subjectPrefix=prefix or None, deleted=deleted):
        versions = client.call("GET", f"/subjects/{subject_path(subject)}/versions", deleted=deleted)
        click.echo(f"{subject}  versions {', '.join(map(str, versions))}")


@schema.command()
@click.argument("subject", required=False)
@click.argument("version", default="latest")
@click.option("--id", "schema_id", type=int, default=None, help="Show the schema this id names instead.")
@click.pass_context
def show(ctx: click.Context, subject: str | None, version: str, schema_id: int | None) -> None:
    """A subject's VERSION (default: latest), or the schema an --id names."""
    if schema_id is not None:
        _echo(_client(ctx).call("GET", f"/schemas/ids/{schema_id}"))
    elif subject:
        _echo(_client(ctx).call("GET", f"/subjects/{subject_path(subject)}/versions/{version}"))
    else:
        raise click.UsageError("name a SUBJECT or an --id")


@schema.command()
@_schema_file
@click.pass_context
def check(ctx: click.Context, subject: str, file: str, schema_type: str, references: tuple[str, ...]) -> None:
    """Whether FILE's schema may be registered under SUBJECT (exit code 1 if not, with the reasons)."""
    answer = _client(ctx).call("POST", f"/compatibility/subjects/{subject_path(subject)}/versions",
                               _schema_body(file, schema_type.upper(), references), verbose=True)
    if not answer["is_compatible"]:
        raise click.ClickException("incompatible: " + "; ".join(answer.get("messages", [])))
    click.echo(f"{subject}: compatible")


@schema.command()
@click.argument("subject")
@click.argument("version", required=False)
@click.option("--permanent", is_flag=True, help="Delete for good (after a soft delete).")
@click.pass_context
def delete(ctx: click.Context, subject: str, version: str | None, permanent: bool) -> None:
    """Delete SUBJECT (or one VERSION of it): soft first, then --permanent."""
    path = f"/subjects/{subject_path(subject)}" + (f"/versions/{version}" if version else "")
    answer = _client(ctx).call("DELETE", path, permanent=permanent)
    click.echo(f"{subject}: deleted version(s) {answer}")


@schema.command()
@click.argument("subject", required=False)
@click.option("--set", "level", default=None, help="Set the compatibility level (NONE, BACKWARD, ... FULL_TRANSITIVE).")
@click.pass_context
def config(ctx: click.Context, subject: str | None, level: str | None) -> None:
    """The compatibility level of SUBJECT (default: the global one); --set changes it."""
    path = "/config" + (f"/{subject_path(subject)}" if subject else "")
    if level:
        _echo(_client(ctx).call("PUT", path, {"compatibility": level.upper()}))
    else:
        _echo(_client(ctx).call("GET", path, defaultToGlobal=bool(subject)))
