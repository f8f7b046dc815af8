"""`memq token create|revoke` and `memq acl add|remove|list`: credentials and ACLs.

Where they are kept: with ZooKeeper configured (`zookeeper.enabled`, as in the config
`memq dev` writes) in the cluster's znode `<root>/<cluster>/security`, which brokers watch,
so a change applies without a restart; otherwise in the config file's `[security]` section
(`tokens`, `acls`), edited in place (comments and layout kept, by tomlkit) after checking the
new value, which brokers read when they start. Brokers use the config file's entries plus the
stored ones.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click
import tomlkit

from memq.cli._common import CliState, config_of
from memq.config import load_config
from memq.errors import ConfigError
from memq.security.acl import parse_rule, parse_rules
from memq.security.tokens import new_token

RESTART_NOTE = "brokers read [security] when they start: restart them to apply"
LIVE_NOTE = "brokers apply it at once"

Change = Callable[[list[str]], list[str]]


@dataclass(frozen=True)
class Target:
    """Where this invocation keeps tokens and ACLs: `edit(key, change)` replaces list `key`
    ("tokens" or "acls") by `change(old)` (which may run more than once: keep it pure) and
    returns the new list; `read(key)` is the list now."""

    where: str
    note: str
    edit: Callable[[str, Change], list[str]]
    read: Callable[[str], list[str]]


def _config_path(ctx: click.Context) -> Path:
    state = ctx.find_object(CliState)
    if state is None or not state.config_path:
        raise ConfigError("this command edits the config file: name it with --config or MEMQ_CONFIG")
    return Path(state.config_path)


@contextmanager
def target(ctx: click.Context) -> Iterator[Target]:
    """ZooKeeper when the config enables it, else the config file."""
    config = config_of(ctx)
    if not config.zookeeper.enabled:
        path = _config_path(ctx)
        yield Target(str(path), RESTART_NOTE, lambda key, change: edit_security_list(path, key, change),
                     lambda key: _security_list(path, key))
        return
    from memq.governor.registry import Registry
    from memq.governor.security_store import SecurityStore

    with Registry(config.zookeeper, config.cluster.name) as registry:
        store = SecurityStore(registry)
        yield Target(f"ZooKeeper {store.path}", LIVE_NOTE, store.edit,
                     lambda key: list(getattr(store.read()[0], key)))


def edit_security_list(path: Path, key: str, change: Change) -> list[str]:
    """Replace `[security] key` of the TOML file at `path` by `change(old)`, keeping the rest of
    the file as it is; the file is replaced atomically and only if it still loads."""
    doc = _document(path)
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


def _document(path: Path) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(path.read_text()) if path.exists() else tomlkit.document()
    except (OSError, tomlkit.exceptions.ParseError) as e:
        raise ConfigError(f"config file {path}: {e}") from None


def _security_list(path: Path, key: str) -> list[str]:
    """`[security] key` of the file at `path` as it is written ([] when absent)."""
    section = _document(path).get("security", {})
    values = section.get(key, []) if isinstance(section, dict) else []
    return [str(v) for v in values]


@click.group()
def token() -> None:
    """Issue and revoke bearer tokens (stored hashed: in ZooKeeper, or [security] tokens)."""


@token.command("create")
@click.argument("principal")
@click.option("--write", is_flag=True,
              help="Without ZooKeeper: add the hashed entry to the config file's [security] tokens "
                   "(with ZooKeeper it is always stored there).")
@click.pass_context
def token_create(ctx: click.Context, principal: str, write: bool) -> None:
    """Make a token for PRINCIPAL: printed once (give it to the client as producer.token); the
    broker keeps only its hash."""
    secret, entry = new_token(principal)
    stored = write or config_of(ctx).zookeeper.enabled
    if stored:
        with target(ctx) as t:
            t.edit("tokens", lambda old: [*old, str(entry)])
    click.echo(f"token for {principal} (shown once; clients set producer.token or MEMQ_PRODUCER_TOKEN):")
    click.echo(secret)
    if stored:
        click.echo(f"added to {t.where}; {t.note}")
    else:
        click.echo(f'add to [security] tokens in the broker config: "{entry}"')


@token.command("revoke")
@click.argument("principal")
@click.pass_context
def token_revoke(ctx: click.Context, principal: str) -> None:
    """Remove every token of PRINCIPAL."""
    removed = 0

    def drop(old: list[str]) -> list[str]:
        nonlocal removed
        keep = [e for e in old if e.rpartition(":")[0] != principal]
        removed = len(old) - len(keep)
        return keep
    with target(ctx) as t:
        t.edit("tokens", drop)
    if not removed:
        raise ConfigError(f"{t.where}: no token of principal {principal!r}")
    click.echo(f"revoked {removed} token(s) of {principal} in {t.where}; {t.note}")


@click.group()
def acl() -> None:
    """Per-topic ACLs: allow|deny PRINCIPAL produce|describe|admin literal:TOPIC|prefix:PREFIX."""


@acl.command("list")
@click.pass_context
def acl_list(ctx: click.Context) -> None:
    """The ACL rules in force, one per line: the stored ones (ZooKeeper), then the config file's."""
    if config_of(ctx).zookeeper.enabled:
        with target(ctx) as t:
            stored = t.read("acls")
        for rule in parse_rules(stored):
            click.echo(str(rule))
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
    with target(ctx) as t:
        t.edit("acls", lambda old: old if rule in map(_normal, old) else [*old, rule])
    click.echo(f"added {rule!r} to {t.where}; {t.note}")


@acl.command("remove")
@click.argument("permission")
@click.argument("principal")
@click.argument("operation")
@click.argument("pattern")
@click.pass_context
def acl_remove(ctx: click.Context, permission: str, principal: str, operation: str, pattern: str) -> None:
    """Remove a rule (as `memq acl list` prints it)."""
    rule = str(parse_rule(f"{permission} {principal} {operation} {pattern}", "acl remove"))
    found = False

    def drop(old: list[str]) -> list[str]:
        nonlocal found
        keep = [line for line in old if _normal(line) != rule]
        found = len(keep) < len(old)
        return keep
    with target(ctx) as t:
        t.edit("acls", drop)
    if not found:
        raise ConfigError(f"{t.where}: no rule {rule!r}")
    click.echo(f"removed {rule!r} from {t.where}; {t.note}")


def _normal(line: str) -> str:
    return str(parse_rule(line))
