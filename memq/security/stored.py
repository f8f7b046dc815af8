"""The tokens and ACLs a cluster keeps in ZooKeeper, as one JSON document (pure: no I/O).

One document, not a znode per entry: an edit is one compare-and-set, and a broker's watch
sees every change whole. Entries keep the config file's line formats (`PRINCIPAL:SHA256HEX`,
`allow|deny PRINCIPAL OP literal:|prefix:`), checked on every read and before every write.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from memq.errors import ConfigError
from memq.security.acl import parse_rule, parse_rules
from memq.security.tokens import parse_entries

FORMAT_VERSION = 1
KEYS = ("tokens", "acls")


@dataclass(frozen=True)
class StoredSecurity:
    tokens: tuple[str, ...] = ()
    acls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        parse_entries(self.tokens, "stored tokens")
        parse_rules(self.acls, "stored acls")

    def to_json(self) -> bytes:
        return json.dumps({"v": FORMAT_VERSION, "tokens": list(self.tokens), "acls": list(self.acls)},
                          indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes | None, where: str) -> StoredSecurity:
        """The document at `where` (None or empty: nothing stored yet); ConfigError naming
        `where` when it is not one this version writes."""
        if not data:
            return cls()
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise ConfigError(f"{where}: not JSON: {e}") from None
        if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION:
            raise ConfigError(f"{where}: not a version {FORMAT_VERSION} security document (v={doc.get('v')!r})"
                              if isinstance(doc, dict) else f"{where}: not a JSON object")
        lists = {key: doc.get(key, []) for key in KEYS}
        if not all(isinstance(v, list) and all(isinstance(s, str) for s in v) for v in lists.values()):
            raise ConfigError(f"{where}: tokens and acls must be lists of strings")
        try:
            return cls(tuple(lists["tokens"]), tuple(lists["acls"]))
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None

    def edited(self, key: str, change: Change) -> StoredSecurity:
        """This document with list `key` replaced by `change(old)` (checked like every read)."""
        if key not in KEYS:
            raise ConfigError(f"stored security has no list {key!r} (only {', '.join(KEYS)})")
        new = tuple(change(list(getattr(self, key))))
        return StoredSecurity(**{**{k: getattr(self, k) for k in KEYS}, key: new})


# --- the edits every admin path applies (CLI on a file or ZooKeeper, the broker's admin API) --


Change = Callable[[list[str]], list[str]]
Edit = Callable[[str, Change], tuple[list[str], list[str]]]
"""`edit(key, change)`: replace list `key` by `change(old)` (which may run more than once, so
it is pure); returns (old, new) of the write that landed."""


class SecurityLists:
    """Token and ACL administration over one store's `edit` (a config file, ZooKeeper)."""

    def __init__(self, edit: Edit, where: str) -> None:
        self._edit = edit
        self.where = where

    def add_token(self, entry: str) -> None:
        self._edit("tokens", lambda old: [*old, entry])

    def revoke(self, principal: str) -> int:
        """Remove every token of `principal`; how many there were."""
        old, new = self._edit("tokens", lambda old: [e for e in old if e.rpartition(":")[0] != principal])
        return len(old) - len(new)

    def add_rule(self, rule: str) -> bool:
        """Add ACL line `rule` unless an equal one is there (compared parsed); whether it was added."""
        key = _normal_rule(rule)
        old, new = self._edit("acls", lambda old: old if key in map(_normal_rule, old) else [*old, rule])
        return len(new) > len(old)

    def remove_rule(self, rule: str) -> int:
        """Remove the ACL lines equal to `rule`; how many there were."""
        key = _normal_rule(rule)
        old, new = self._edit("acls", lambda old: [line for line in old if _normal_rule(line) != key])
        return len(old) - len(new)

    def rules(self) -> list[str]:
        return self._edit("acls", lambda old: old)[1]


def _normal_rule(line: str) -> str:
    return str(parse_rule(line))
