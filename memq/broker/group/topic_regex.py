"""Subscriptions by regular expression (KIP-848's SubscribedTopicRegex), pure.

Kafka matches them with RE2, whose time is linear in the name; memq uses Python's `re`, which
backtracks, on the coordinator's event loop. So it takes only expressions whose match on a topic
name (at most 249 characters) stays cheap: RE2's syntax has no backreferences or lookarounds,
and memq also refuses a repeat inside a repeat (exponential backtracking) and more than
`MAX_REPEATS` repeats one after another (polynomial: measured on a 249-character name, 3 take
0.02 s, 4 take 0.7 s). Alternatives count apart, so librdkafka's several subscribed patterns
joined by `|` (`orders-.*|audit-.*`) are fine. An expression matches a topic when it matches its
whole name, as Kafka's does.
"""

from __future__ import annotations

import importlib
import re
from functools import lru_cache
from typing import Any

from memq.errors import InvalidInputError

# re's own parser and its node kinds (as of Python 3.11; typeshed has only the deprecated aliases)
_parser: Any = importlib.import_module("re._parser")
sre: Any = importlib.import_module("re._constants")

MAX_REPEATS = 3
_REFUSED = {sre.GROUPREF: "a backreference", sre.GROUPREF_EXISTS: "a conditional on a group",
            sre.ASSERT: "a lookaround", sre.ASSERT_NOT: "a lookaround"}
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)


@lru_cache(maxsize=1024)
def compile_regex(regex: str) -> re.Pattern[str]:
    """`regex` compiled; InvalidInputError saying why it is refused."""
    try:
        parsed = _parser.parse(regex)
    except re.error as e:
        raise InvalidInputError(f"{regex!r} does not parse: {e}") from None
    if (n := _repeats(parsed.data)) > MAX_REPEATS:
        raise InvalidInputError(f"{regex!r} has {n} repeats in a row: memq takes at most {MAX_REPEATS}")
    return re.compile(regex)


def _repeats(items: Any) -> int:
    """The most repeats one path through `items` (a parsed sequence) goes through."""
    total = 0
    for op, av in items:
        if op in _REFUSED:
            raise InvalidInputError(f"{_REFUSED[op]}: RE2, Kafka's syntax, has none")
        if op in _REPEATS:
            _, most, body = av
            inner = _repeats(body)
            if inner and most > 1:
                raise InvalidInputError("a repeat inside a repeat: its match can take exponential time")
            total += inner + (most > 1)
        elif op == sre.BRANCH:
            total += max(_repeats(b) for b in av[1])
        elif op == sre.SUBPATTERN:
            total += _repeats(av[-1])
        elif op == sre.ATOMIC_GROUP:
            total += _repeats(av)
    return total
