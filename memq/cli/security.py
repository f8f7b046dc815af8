"""`memq token create|revoke` and `memq acl add|remove|list`: credentials and ACLs in the config file.

Tokens and ACLs live in the config file's `[security]` section (`tokens`, `acls`); these
commands edit it in place (comments and layout kept, by tomlkit) after checking the new
value, and brokers read it when they start. Storing both in ZooKeeper, watched by brokers
so a change applies without a restart, is a later step.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import click
import tomlkit

from memq.cli._common import CliState, config_of
from memq.config import load_config
from memq.errors import ConfigError
from memq.security.acl import parse_rule, parse_rules
from memq.security.tokens import new_token

RESTART_NOTE = "brokers read [security] when they start: restart them to apply"


def _config_path(ctx: click.Context) -> Path:
    state = ctx.find_object(CliState)
    if state is None or not state.config_path:
        raise ConfigError("this command edits the config file: name it with --config or MEMQ_CONFIG")
    return Path(state.config_path)


def edit_security_list(path: Path, key: str, change: Callable[[list[str]], list[str]]) -> list[str]:
    """Replace `[security] key` of the TOML file at `path` by `change(old)`, keeping the rest of
    the file as it is; the file is replaced atomically and only if it still loads."""
    try:
        doc = tomlkit.parse(path.read_text()) if path.exists() else tomlkit.document()
    except (OSError, tomlkit.exceptions.ParseError) as e:
        raise ConfigError(f"config file {path}: {e}") from None
    section = doc.setdefault("security", tomlkit.table())
    new = change([str(v) for v in section.get(key, [])])
    array = tomlkit.array()
    array.extend(new)
    section[key] = array.multiline(True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(tomlkit.dumps(doc))
        load_config(tmp, env={})     # never leave a file the broker would refuse
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return new


@click.group()
def token() -> None:
    """Issue and revoke bearer tokens (stored hashed in [security] tokens)."""


@token.command("create")
@click.argument("principal")
@click.option("--write", is_flag=True, help="Add the hashed entry to the config file's [security] tokens.")
@click.pass_context
def token_create(ctx: click.Context, principal: str, write: bool) -> None:
    """Make a token for PRINCIPAL: printed once (give it to the client as producer.token); the
    broker keeps only its hash."""
    secret, entry = new_token(principal)
    click.echo(f"token for {principal} (shown once; clients set producer.token or MEMQ_PRODUCER_TOKEN):")
    click.echo(secret)
    if write:
        path = _config_path(ctx)
        edit_security_list(path, "tokens", lambda old: [*old, str(entry)])
        click.echo(f"added to [security] tokens in {path}; {RESTART_NOTE}")
    else:
        click.echo(f'add to [security] tokens in the broker config: "{entry}"')


@token.command("revoke")
@click.argument("principal")
@click.pass_context
def token_revoke(ctx: click.Context, principal: str) -> None:
    """Remove every token of PRINCIPAL from the config file."""
    path = _config_path(ctx)
    removed: list[str] = []

    def drop(old: list[str]) -> list[str]:
        keep = [e for e in old if e.rpartition(":")[0] != principal]
        removed.extend(set(old) - set(keep))
        return keep
    edit_security_list(path, "tokens", drop)
    if not removed:
        raise ConfigError(f"security.tokens in {path}: no token of principal {principal!r}")
    click.echo(f"revoked {len(removed)} token(s) of {principal}; {RESTART_NOTE}")


@click.group()
def acl() -> None:
    """Per-topic ACLs: allow|deny PRINCIPAL produce|describe|admin literal:TOPIC|prefix:PREFIX."""


@acl.command("list")
@click.pass_context
def acl_list(ctx: click.Context) -> None:
    """The ACL rules of the config, one per line."""
    for rule in parse_rules(config_of(ctx).security.acls):
        click.echo(str(rule))


@acl.command("add")
@click.argument("permission")
@click.argument("principal")
@click.argument("operation")
@click.argument("pattern")
@click.pass_context
def acl_add(ctx: click.Context, permission: str, principal: str, operation: str, pattern: str) -> None:
    """Add a rule, e.g. `memq acl add allow alice produce prefix:orders.`"""
    rule = str(parse_rule(f"{permission} {principal} {operation} {pattern}", "acl add"))
    path = _config_path(ctx)
    edit_security_list(path, "acls", lambda old: old if rule in map(_normal, old) else [*old, rule])
    click.echo(f"added {rule!r} to {path}; {RESTART_NOTE}")


@acl.command("remove")
@click.argument("permission")
@click.argument("principal")
@click.argument("operation")
@click.argument("pattern")
@click.pass_context
def acl_remove(ctx: click.Context, permission: str, principal: str, operation: str, pattern: str) -> None:
    """Remove a rule (as `memq acl list` prints it)."""
    rule = str(parse_rule(f"{permission} {principal} {operation} {pattern}", "acl remove"))
    path = _config_path(ctx)
    found: list[bool] = []

    def drop(old: list[str]) -> list[str]:
        keep = [line for line in old if _normal(line) != rule]
        found.append(len(keep) < len(old))
        return keep
    edit_security_list(path, "acls", drop)
    if not found[0]:
        raise ConfigError(f"security.acls in {path}: no rule {rule!r}")
    click.echo(f"removed {rule!r} from {path}; {RESTART_NOTE}")


def _normal(line: str) -> str:
    return str(parse_rule(line))

