"""Security test helpers: two users' tokens (the bearer secret and its config entry), and one
confluent-kafka send with SASL/PLAIN over TLS."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from memq.security.tokens import new_token

ALICE, ALICE_ENTRY = new_token("alice")
BOB, BOB_ENTRY = new_token("bob")


def kafka_send(address: str, topic: str, value: bytes, **conf: Any) -> tuple[list[str], list[str]]:
    """Produce one record with confluent-kafka; (delivery errors, client errors) as text."""
    delivery: list[str] = []
    client: list[str] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            delivery.append(f"{err.name()}: {err.str()}")

    p = Producer({"bootstrap.servers": address, "message.timeout.ms": 8_000, "linger.ms": 1,
                  "error_cb": lambda e: client.append(f"{e.name()}: {e.str()}"), **conf})
    p.produce(topic, value=value, on_delivery=delivered)
    p.flush(20)
    return delivery, client


def sasl(ca: str, user: str, password: str) -> dict[str, str]:
    """confluent-kafka settings for SASL/PLAIN (a memq token as the password) over TLS trusting `ca`."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": password, "ssl.ca.location": ca}
