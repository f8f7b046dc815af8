"""Share sessions (KIP-932), pure: which partitions each member fetches on this broker, by epoch.

A member opens its session with epoch 0 (replacing one it had: what the old one held is
released), counts up by one with each request after that, and closes it with -1. Any other
epoch is INVALID_SHARE_SESSION_EPOCH; a request for a session this broker does not know is
SHARE_SESSION_NOT_FOUND (the client opens a new one). A session unused for the session timeout
has lost its member: it expires, and what its member held is released.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memq.kafka_api.share import Key, ShareError

SessionId = tuple[str, str]        # (group, member id)


@dataclass(slots=True)
class Session:
    """A member's share session on this broker: the partitions it fetches, its epoch."""

    epoch: int
    seen: float
    keys: set[Key] = field(default_factory=set)


class ShareSessions:
    """The open sessions of this broker; time is the caller's (`now`, monotonic seconds)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.open: dict[SessionId, Session] = {}

    def expired(self, now: float) -> list[tuple[SessionId, Session]]:
        """Sessions unused for the timeout, removed: the caller releases what their members held."""
        gone = [(k, s) for k, s in self.open.items() if s.seen < now - self.timeout_s]
        for k, _ in gone:
            del self.open[k]
        return gone

    def step(self, group: str, member: str, epoch: int, keys: list[Key], now: float
             ) -> tuple[Session | None, ShareError, Session | None]:
        """A request of `member` at `epoch` naming `keys`: (its session or None, the error when
        None, a session it replaced, whose partitions the caller releases). Epoch -1 closes the
        session (it is returned one last time)."""
        sid = (group, member)
        if epoch == 0:
            old = self.open.pop(sid, None)
            s = self.open[sid] = Session(0, now, set(keys))
            return s, ShareError.NONE, old
        found = self.open.get(sid)
        if found is None:
            return None, ShareError.SHARE_SESSION_NOT_FOUND, None
        s = found
        s.seen = now
        if epoch == -1:
            del self.open[sid]
            return s, ShareError.NONE, None
        if epoch != s.epoch + 1:
            return None, ShareError.INVALID_SHARE_SESSION_EPOCH, None
        s.epoch = epoch
        s.keys.update(keys)
        return s, ShareError.NONE, None
