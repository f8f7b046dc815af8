"""When a quiet Kafka connection may seal a small batch early (pure logic, no I/O).

Kafka has no flush a broker could see: a connection quiet with acks=all Messages waiting is a
producer waiting on us (`doors.kafka_produce.ProduceState`). Sealing then spares it `batch_ms`, but
costs an object. A batch of `unit` bytes (`broker.kafka_idle_seal_bytes`) or more may always
seal; a smaller one only while the connection has credit: it earns the bytes it appends and
each idle seal spends `unit`. So a bulk producer's last partial batch goes at once, while
early objects stay at most one per `unit` a connection sends, and a trickle waits for batch_ms.
The credit is capped at `bank` bytes, so a bulk producer turned trickle gets at most
`bank // unit` early objects before it must earn more.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SealCredit:
    unit: int
    bank: int
    credit: int = 0

    def earn(self, nbytes: int) -> None:
        """`nbytes` were appended for this connection."""
        self.credit = min(self.credit + nbytes, self.bank)

    def threshold(self) -> int:
        """The fewest bytes a batch must hold to be sealed now."""
        return 1 if self.credit >= self.unit else self.unit

    def spend(self) -> None:
        """An idle seal happened."""
        self.credit = max(self.credit - self.unit, 0)
