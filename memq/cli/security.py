"""`memq token create|revoke` and `memq acl add|remove|list`: credentials and ACLs.

With credentials in the config (`producer.token` or a client certificate) the commands go
through the brokers' admin API (memq.client.admin), which needs `admin` on the cluster.
Otherwise they work where tokens and ACLs are kept: with ZooKeeper configured (`zookeeper.enabled`, as in the config
`memq dev` writes) in the cluster's znode `<root>/<cluster>/security`, which brokers watch,
so a change applies without a restart; otherwise in the config file's `[security]` section
(`tokens`, `acls`), edited in place (comments and layout kept, by tomlkit) after checking the
new value, which brokers read when they start. Brokers use the config file's entries plus the
stored ones.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import click
import tomlkit

from memq.cli._common import CliState, config_of
from memq.config import load_config
from memq.errors import ConfigError
from memq.security.acl import parse_rule, parse_rules
from memq.security.stored import Change, SecurityLists
from memq.security.tokens import new_token

RESTART_NOTE = "brokers read [security] when they start: restart them to apply"
LIVE_NOTE = "brokers apply it at once"


class Admin(Protocol):
    """Token and ACL administration (memq.security.stored.SecurityLists, memq.client.admin.BrokerAdmin)."""

    where: str

    def add_token(self, entry: str) -> None: ...
    def revoke(self, principal: str) -> int: ...
    def add_rule(self, rule: str) -> bool: ...
    def remove_rule(self, rule: str) -> int: ...
    def rules(self) -> list[str]: ...


def _config_path(ctx: click.Context) -> Path:
    state = ctx.find_object(CliState)
    if state is None or not state.config_path:
        raise ConfigError("this command edits the config file: name it with --config or MEMQ_CONFIG")
    return Path(state.config_path)


@dataclass(frozen=True)
class Target:
    """Where this invocation administers tokens and ACLs; `note`: when brokers apply a change;
    `config_acls`: rules in force besides those `admin.rules()` lists (the config file's, which
    brokers on ZooKeeper use as well)."""

    admin: Admin
    note: str
    config_acls: tuple[str, ...] = ()


@contextmanager
def target(ctx: click.Context) -> Iterator[Target]:
    """Through the brokers (with credentials), ZooKeeper (when enabled), else the config file."""
    from memq.client.admin import BrokerAdmin, through_brokers

    config = config_of(ctx)
    if through_brokers(config.producer):
        yield Target(BrokerAdmin(config.producer), LIVE_NOTE)
    elif config.zookeeper.enabled:
        from memq.governor.registry import Registry
        from memq.governor.security_store import SecurityStore

        with Registry(config.zookeeper, config.cluster.name) as registry:
            yield Target(SecurityStore(registry).lists(), LIVE_NOTE, config.security.acls)
    else:
        path = _config_path(ctx)
        yield Target(SecurityLists(lambda key, change: edit_security_list(path, key, change),
                                   f"config file {path}"), RESTART_NOTE)


def edit_security_list(path: Path, key: str, change: Change) -> tuple[list[str], list[str]]:
    """Replace `[security] key` of the TOML file at `path` by `change(old)`, keeping the rest of
    the file as it is; the file is replaced atomically and only if it still loads (and not at
    all when nothing changes). Returns (old, new)."""
    try:
        doc = tomlkit.parse(path.read_text()) if path.exists() else tomlkit.document()
    except (OSError, tomlkit.exceptions.ParseError) as e:
        raise ConfigError(f"config file {path}: {e}") from None
    section = doc.setdefault("security", tomlkit.table())
    old = [str(v) for v in section.get(key, [])]
    new = change(old)
    if new == old:
        return old, new
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
    return old, new


@click.group()
def token() -> None:
    """Issue and revoke bearer tokens (stored hashed: in ZooKeeper, or [security] tokens)."""


@token.command("create")
@click.argument("principal")
@click.option("--write", is_flag=True,
              help="Without ZooKeeper: add the hashed entry to the config file's [security] tokens "
                   "(with ZooKeeper, or through the brokers, it is always stored).")
@click.pass_context
def token_create(ctx: click.Context, principal: str, write: bool) -> None:
    """Make a token for PRINCIPAL: printed once (give it to the client as producer.token); the
    broker keeps only its hash."""
    from memq.client.admin import through_brokers

    secret, entry = new_token(principal)
    config = config_of(ctx)
    stored = write or config.zookeeper.enabled or through_brokers(config.producer)
    if stored:
        with target(ctx) as t:
            t.admin.add_token(str(entry))
    click.echo(f"token for {principal} (shown once; clients set producer.token or MEMQ_PRODUCER_TOKEN):")
    click.echo(secret)
    if stored:
        click.echo(f"added to {t.admin.where}; {t.note}")
    else:
        click.echo(f'add to [security] tokens in the broker config: "{entry}"')


@token.command("revoke")
@click.argument("principal")
@click.pass_context
def token_revoke(ctx: click.Context, principal: str) -> None:
    """Remove every token of PRINCIPAL."""
    with target(ctx) as t:
        removed = t.admin.revoke(principal)
    if not removed:
        raise ConfigError(f"{t.admin.where}: no token of principal {principal!r}")
    click.echo(f"revoked {removed} token(s) of {principal} in {t.admin.where}; {t.note}")


@click.group()
def acl() -> None:
    """ACLs: allow|deny PRINCIPAL produce|consume|describe|admin literal:TOPIC|prefix:PREFIX|group:GROUP|group-prefix:P."""


@acl.command("list")
@click.pass_context
def acl_list(ctx: click.Context) -> None:
    """The ACL rules in force, one per line: the stored ones (ZooKeeper), then the config file's."""
    with target(ctx) as t:
        rules = [*t.admin.rules(), *t.config_acls]
    for rule in parse_rules(rules):
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
    with target(ctx) as t:
        t.admin.add_rule(rule)
    click.echo(f"added {rule!r} to {t.admin.where}; {t.note}")


@acl.command("remove")
@click.argument("permission")
@click.argument("principal")
@click.argument("operation")
@click.argument("pattern")
@click.pass_context
def acl_remove(ctx: click.Context, permission: str, principal: str, operation: str, pattern: str) -> None:
    """Remove a rule (as `memq acl list` prints it)."""
    rule = str(parse_rule(f"{permission} {principal} {operation} {pattern}", "acl remove"))
    with target(ctx) as t:
        removed = t.admin.remove_rule(rule)
    if not removed:
        raise ConfigError(f"{t.admin.where}: no rule {rule!r}")
    click.echo(f"removed {rule!r} from {t.admin.where}; {t.note}")
