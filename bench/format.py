"""LogMessage encode/decode rates of memq.format against bare msgpack on the same records.

Both sides handle the same records in the same groups (one Message = `PER_MESSAGE`
records): the peer is `msgpack.packb(group)` / `msgpack.unpackb(packed)`, memq is
`encode_message` / `decode_message` with codec NONE (header, CRCs, checks, LogMessage
objects); zstd figures are printed alongside. The machine is shared, so each group is
timed for both sides back to back (order alternating, so neither always finds the records
in cache) in CPU time (`process_time`), and each side's best round counts.

The ratios `encode`/`decode` are measured with the inputs moved out of the GC's reach
(`gc.freeze`), so they price the format's own work. Each timed call ends with the young
collection it left due (if any) while its result is still alive, so GC work deferred by
memq's paused decode is charged to memq, as an application keeping the records pays it. `decode_live_heap` repeats the decode
pair with the 200k input records left in the heap, as in a consumer holding data: there
bare msgpack's lists trigger ~4x more collections than memq's tuples, each scanning the heap.
"""

from __future__ import annotations

import gc
import random
import time
from typing import Any, Callable

import msgpack

from memq.format import Codec, Compressors, LogMessage, decode_message, encode_message

PER_MESSAGE = 1000
VALUE_BYTES = 100

Step = Callable[[Any], object]


def make_records(n: int, seed: int = 7) -> list[LogMessage]:
    rnd = random.Random(seed)
    base = 1_700_000_000_000
    return [LogMessage(rnd.randbytes(VALUE_BYTES), b"key-%08d" % i, (("source", b"bench"),),
                       base + i, None) for i in range(n)]


def _paired_rates(peer: Step, memq: Step, peer_inputs: list, memq_inputs: list,
                  n: int) -> tuple[float, float]:
    """One round: records/s of `peer` and `memq`, each group timed for both back to back."""
    clock = time.process_time
    spent = [0.0, 0.0]
    for i, pair in enumerate(zip(peer_inputs, memq_inputs)):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            fn = peer if side == 0 else memq
            start = clock()
            out = fn(pair[side])
            _collect_due()
            del out
            spent[side] += clock() - start
    return n / spent[0], n / spent[1]


def _collect_due() -> None:
    """Run the young collection a timed call left due, on that call's clock and with its
    result alive. memq's decoders pause the GC; were the collection they defer left for later,
    it would land on the other side's clock or vanish with the discarded result, while an
    application keeping the records pays it."""
    if gc.get_count()[0] > gc.get_threshold()[0]:
        gc.collect(0)


def run(quick: bool = False) -> dict:
    n = 50_000 if quick else 200_000
    rounds = 5 if quick else 9
    records = make_records(n)
    groups = [records[i:i + PER_MESSAGE] for i in range(0, n, PER_MESSAGE)]
    comp = Compressors()

    def encoder(codec: Codec) -> Step:
        return lambda g: encode_message(g, producer_id=1, epoch=1, sequence=0, codec=codec,
                                        compressors=comp)

    def decoder(m: bytes) -> object:
        return decode_message(m, compressors=comp)

    packed = [msgpack.packb(g) for g in groups]
    plain = list(map(encoder(Codec.NONE), groups))
    zstd = list(map(encoder(Codec.ZSTD), groups))
    print(f"format bench: {n} records, {VALUE_BYTES} B values, {PER_MESSAGE} per Message, "
          f"{rounds} rounds, CPU time", flush=True)
    pairs = {
        "encode": (msgpack.packb, encoder(Codec.NONE), groups, groups),
        "decode": (msgpack.unpackb, decoder, packed, plain),
        "zstd_encode": (msgpack.packb, encoder(Codec.ZSTD), groups, groups),
        "zstd_decode": (msgpack.unpackb, decoder, packed, zstd),
    }
    best = _best_rates(pairs, rounds, n, frozen=True)
    print("decode again with the input records live in the heap", flush=True)
    live = _best_rates({"decode_live_heap": pairs["decode"]}, rounds, n, frozen=False)
    best.update(live)
    return {
        "ratios": {name: round(best[name][1] / best[name][0], 3)
                   for name in ("encode", "decode", "decode_live_heap")},
        "encode_msgs_per_s": round(best["encode"][1]),
        "decode_msgs_per_s": round(best["decode"][1]),
        "msgpack_encode_per_s": round(best["encode"][0]),
        "msgpack_decode_per_s": round(best["decode"][0]),
        "live_heap_decode_msgs_per_s": round(best["decode_live_heap"][1]),
        "live_heap_msgpack_decode_per_s": round(best["decode_live_heap"][0]),
        "zstd_encode_msgs_per_s": round(best["zstd_encode"][1]),
        "zstd_decode_msgs_per_s": round(best["zstd_decode"][1]),
        "zstd_vs_msgpack": {"encode": round(best["zstd_encode"][1] / best["zstd_encode"][0], 3),
                            "decode": round(best["zstd_decode"][1] / best["zstd_decode"][0], 3)},
        "zstd_size_ratio": round(sum(map(len, zstd)) / sum(map(len, plain)), 3),
        "records": n,
        "records_per_message": PER_MESSAGE,
    }


def _best_rates(pairs: dict[str, tuple[Step, Step, list, list]], rounds: int, n: int, *,
                frozen: bool) -> dict[str, list[float]]:
    """Each pair's best (peer, memq) records/s over `rounds`."""
    best = {name: [0.0, 0.0] for name in pairs}
    gc.collect()
    if frozen:
        gc.freeze()
    try:
        for r in range(rounds):
            for name, (peer, memq, peer_in, memq_in) in pairs.items():
                rates = _paired_rates(peer, memq, peer_in, memq_in, n)
                best[name] = [max(b, x) for b, x in zip(best[name], rates)]
            print(f"round {r + 1}/{rounds}: " + ", ".join(
                f"{name} msgpack {p / 1e6:.2f}M/s memq {m / 1e6:.2f}M/s"
                for name, (p, m) in best.items()), flush=True)
    finally:
        gc.unfreeze()
    return best
