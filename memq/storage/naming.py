"""Object key layout, pure (no I/O): build and parse batch keys.

Key of a topic's own object: `<pp>/<cluster>/topics/<topic>/<13-digit ms>-<broker>-<unique>-a<attempt>`;
of a storage group's object (parts of many topics): `<pp>/<cluster>/groups/<group>/<same name>`,
so a bucket policy on `*/<cluster>/groups/<group>/*` scopes a group, as `*/topics/<topic>/*` a topic.
`pp` is 2 hex digits of CRC32C(first request id), which spreads a topic's objects evenly
over 256 prefixes so S3's per-prefix request rate limit is never the bottleneck. The
timestamp is zero-padded to 13 digits so that, inside one prefix, key order is time order
and a listing can start at a time with `StartAfter`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import crc32c

from memq.errors import InvalidInputError

PREFIX_COUNT = 256
PREFIXES: tuple[str, ...] = tuple(f"{i:02x}" for i in range(PREFIX_COUNT))
MAX_TIMESTAMP_MS = 10**13 - 1

_NAME_PART = re.compile(r"[A-Za-z0-9._-]+")
_UNIQUE = re.compile(r"[0-9a-f]+")
_LEAF = re.compile(r"(?P<ts>\d{13})-(?P<broker>[A-Za-z0-9._-]+)-(?P<unique>[0-9a-f]+)-a(?P<attempt>\d+)")


@dataclass(frozen=True, slots=True)
class ObjectKey:
    """The parts of a batch object's key: a topic's own (`group` "") or a storage group's (`topic` "")."""

    prefix: str
    cluster: str
    topic: str
    timestamp_ms: int
    broker_id: str
    unique: str
    attempt: int
    group: str = ""

    @property
    def home(self) -> str:
        """The directory below the cluster: `topics/<topic>` or `groups/<group>`."""
        return f"groups/{self.group}" if self.group else f"topics/{self.topic}"

    def __str__(self) -> str:
        return (f"{self.prefix}/{self.cluster}/{self.home}/"
                f"{self.timestamp_ms:013d}-{self.broker_id}-{self.unique}-a{self.attempt}")


def check_name(what: str, value: str) -> None:
    """A cluster, topic or broker name becomes one key segment: no '/', nothing exotic."""
    if not isinstance(value, str) or not _NAME_PART.fullmatch(value):
        raise InvalidInputError(f"{what} {value!r}: use letters, digits, '.', '_', '-'")


def prefix_for(first_request_id: int) -> str:
    """The 2-hex-digit prefix of a batch, from its first request id (a u64)."""
    if isinstance(first_request_id, bool) or not isinstance(first_request_id, int) \
            or not 0 <= first_request_id < 2**64:
        raise InvalidInputError(f"first_request_id {first_request_id!r} is not a u64")
    return PREFIXES[crc32c.crc32c(first_request_id.to_bytes(8, "big")) & 0xFF]


def topic_home(topic: str) -> str:
    """The directory (below the cluster) of a topic's own objects."""
    check_name("topic", topic)
    return f"topics/{topic}"


def group_home(group: str) -> str:
    """The directory (below the cluster) of a storage group's shared objects."""
    check_name("storage group", group)
    return f"groups/{group}"


def home_dir(prefix: str, cluster: str, home: str) -> str:
    """The key prefix (ending in '/') of one prefix's objects under `home` (`topic_home`, `group_home`)."""
    return f"{prefix}/{cluster}/{home}/"


def make_key(*, cluster: str, topic: str, first_request_id: int, timestamp_ms: int,
             broker_id: str, unique: str, attempt: int, group: str = "") -> ObjectKey:
    """Validate the parts and build a key; every part ends up in the name, so none may hold '/'.
    With `group`, the key of that storage group's shared object (`topic` is then not in it)."""
    check_name("cluster", cluster)
    if group:
        check_name("storage group", group)
        topic = ""
    else:
        check_name("topic", topic)
    check_name("broker_id", broker_id)
    if not _UNIQUE.fullmatch(unique):
        raise InvalidInputError(f"unique {unique!r}: use lowercase hex digits")
    if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) \
            or not 0 <= timestamp_ms <= MAX_TIMESTAMP_MS:
        raise InvalidInputError(f"timestamp_ms {timestamp_ms!r} is not within 0..{MAX_TIMESTAMP_MS}")
    if attempt < 0:
        raise InvalidInputError(f"attempt {attempt} must be >= 0")
    return ObjectKey(prefix_for(first_request_id), cluster, topic, timestamp_ms, broker_id,
                     unique, attempt, group)


def parse_key(key: str) -> ObjectKey:
    """Split a batch key (a topic's or a group's) into its parts; `InvalidInputError` if it is
    not a memq batch key."""
    parts = key.split("/")
    if len(parts) != 5 or parts[2] not in ("topics", "groups") or parts[0] not in _PREFIX_SET \
            or not _NAME_PART.fullmatch(parts[1]) or not _NAME_PART.fullmatch(parts[3]):
        raise InvalidInputError(f"{key!r} is not a memq batch key "
                                "(<pp>/<cluster>/topics/<topic>/<name> or <pp>/<cluster>/groups/<group>/<name>)")
    if parts[2] == "groups":
        return ObjectKey(parts[0], parts[1], "", *parse_name(parts[4]), group=parts[3])
    return ObjectKey(parts[0], parts[1], parts[3], *parse_name(parts[4]))


def parse_name(name: str) -> tuple[int, str, str, int]:
    """(timestamp_ms, broker_id, unique, attempt) from a key's last part."""
    m = _LEAF.fullmatch(name)
    if m is None:
        raise InvalidInputError(f"{name!r} is not a memq batch name (<13-digit ms>-<broker>-<hex>-a<n>)")
    return int(m["ts"]), m["broker"], m["unique"], int(m["attempt"])


def start_after(directory: str, start_ms: int) -> str:
    """A key that sorts just before every object in `directory` (a `home_dir`) with timestamp >= start_ms."""
    return f"{directory}{max(start_ms, 0):013d}"


_PREFIX_SET = frozenset(PREFIXES)
