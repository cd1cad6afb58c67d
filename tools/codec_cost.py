"""What each wire format's own work costs on one CPU thread: encode, decode, and the encoding
with error feedback that every averaging does (``dssync.comm.wire``), per buffer size.

Also times int8's decode written as one mixed-dtype multiply (``int8 * float32``), the form the
decoder had before 2026-12-05's tenth session, beside the form it has now (a cast, then a float
multiply), and checks that both give the same bits.

    .venv/bin/python tools/codec_cost.py --numel 4000000 --reps 20
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dssync.comm.wire import CHUNK, WIRES, _unpacked, codec_for, encode_with_feedback


def _ms(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return round((time.perf_counter() - t0) / reps * 1e3, 2)


def measure(numel: int, reps: int) -> list[dict]:
    torch.manual_seed(0)
    x = torch.randn(numel)
    rows = []
    for wire in WIRES:
        codec = codec_for(wire)
        e = torch.zeros(numel)
        msg = codec.encode(x)
        rows.append(
            {
                "numel": numel,
                "wire": wire,
                "encode_ms": _ms(lambda c=codec: c.encode(x), reps),
                "decode_ms": _ms(lambda c=codec, m=msg: c.decode(m, numel, x.dtype), reps),
                "feedback_ms": _ms(lambda c=codec, e=e: encode_with_feedback(c, x, e), reps),
            }
        )
    q, scale = _unpacked(codec_for("int8").encode(x)[0])
    q = q.view(-1, CHUNK)
    mixed = torch.mul(q, scale[:, None]).reshape(-1)[:numel]
    now = codec_for("int8").decode(
        [torch.cat([q.reshape(-1), scale.view(torch.int8)])], numel, x.dtype
    )
    rows.append(
        {
            "numel": numel,
            "wire": "int8, decoded by one mixed-dtype multiply (before)",
            "decode_ms": _ms(lambda: torch.mul(q, scale[:, None]), reps),
            "same_bits_as_now": bool(torch.equal(mixed, now)),
        }
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, action="append", help="buffer elements (repeatable)")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    for numel in a.numel or [4_000_000]:
        for row in measure(numel, a.reps):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
