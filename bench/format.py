"""LogMessage encode/decode rates of memq.format against bare msgpack on the same records.

Both sides handle the same records in the same groups (one Message = `PER_MESSAGE`
records): the peer is `msgpack.packb(group)` / `msgpack.unpackb(packed)`, memq is
`encode_message` / `decode_message` with codec NONE (header, CRCs, checks, LogMessage
objects). zstd figures are printed alongside. Rounds alternate peer and memq so machine
noise hits both; each side's best round counts.
"""

from __future__ import annotations

import random
import time
from typing import Callable

import msgpack

from memq.format import Codec, Compressors, LogMessage, decode_message, encode_message

PER_MESSAGE = 1000
VALUE_BYTES = 100


def make_records(n: int, seed: int = 7) -> list[LogMessage]:
    rnd = random.Random(seed)
    base = 1_700_000_000_000
    return [LogMessage(rnd.randbytes(VALUE_BYTES), b"key-%08d" % i, (("source", b"bench"),),
                       base + i, None) for i in range(n)]


def _rate(n: int, fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return n / (time.perf_counter() - start)


def run(quick: bool = False) -> dict:
    n = 50_000 if quick else 200_000
    rounds = 3 if quick else 5
    records = make_records(n)
    groups = [records[i:i + PER_MESSAGE] for i in range(0, n, PER_MESSAGE)]
    comp = Compressors()
    packed = [msgpack.packb(g) for g in groups]
    encoded = {c: [encode_message(g, producer_id=1, epoch=1, sequence=i, codec=c,
                                  compressors=comp) for i, g in enumerate(groups)]
               for c in (Codec.NONE, Codec.ZSTD)}
    print(f"format bench: {n} records of {VALUE_BYTES} B values, {PER_MESSAGE} per Message, "
          f"{rounds} rounds", flush=True)

    def consume(fn: Callable[[object], object], items: list) -> Callable[[], None]:
        def go() -> None:
            for item in items:
                fn(item)
        return go

    def memq_encode(codec: Codec) -> Callable[[list[LogMessage]], bytes]:
        return lambda g: encode_message(g, producer_id=1, epoch=1, sequence=0, codec=codec,
                                        compressors=comp)

    cases: dict[str, Callable[[], None]] = {
        "msgpack_encode": consume(msgpack.packb, groups),
        "memq_encode": consume(memq_encode(Codec.NONE), groups),
        "msgpack_decode": consume(msgpack.unpackb, packed),
        "memq_decode": consume(lambda m: decode_message(m, compressors=comp),
                               encoded[Codec.NONE]),
        "memq_zstd_encode": consume(memq_encode(Codec.ZSTD), groups),
        "memq_zstd_decode": consume(lambda m: decode_message(m, compressors=comp),
                                    encoded[Codec.ZSTD]),
    }
    best = dict.fromkeys(cases, 0.0)
    for r in range(rounds):
        for name, fn in cases.items():
            best[name] = max(best[name], _rate(n, fn))
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {v / 1e6:.2f}M/s"
                                                     for k, v in best.items()), flush=True)
    raw = sum(map(len, encoded[Codec.NONE]))
    zstd = sum(map(len, encoded[Codec.ZSTD]))
    return {
        "ratios": {"encode": round(best["memq_encode"] / best["msgpack_encode"], 3),
                   "decode": round(best["memq_decode"] / best["msgpack_decode"], 3)},
        "encode_msgs_per_s": round(best["memq_encode"]),
        "decode_msgs_per_s": round(best["memq_decode"]),
        "msgpack_encode_per_s": round(best["msgpack_encode"]),
        "msgpack_decode_per_s": round(best["msgpack_decode"]),
        "zstd_encode_msgs_per_s": round(best["memq_zstd_encode"]),
        "zstd_decode_msgs_per_s": round(best["memq_zstd_decode"]),
        "zstd_size_ratio": round(zstd / raw, 3),
        "records": n,
        "records_per_message": PER_MESSAGE,
    }
