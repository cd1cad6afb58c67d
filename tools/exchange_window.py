"""A DS-Sync pair step against a raw whole-buffer exchange, with the exchange's chunk size and
window (chunks of a pair in their first phase at once) set per run: how DEFAULT_WINDOW was
chosen (docs/history.md, 2026-12-05).

Runs ``dssync.lab.bench.sync_cost.measure`` (what ``dssync bench-sync`` runs) on loopback with each
setting, and prints the median per-step ratio and its quartiles.

    .venv/bin/python tools/exchange_window.py --params 16000000 --steps 30 \\
        --setting 4:2 --setting 4:4 --setting 16:2 --setting 64:1 --setting 1:4
"""

from __future__ import annotations

import argparse
import json

from dssync.lab.bench import sync_cost
from dssync.lab.launch import spawn
from dssync.strategies import DSSync


def _measure(numel: int, chunk_bytes: int, window: int, steps: int) -> dict:
    build = DSSync.__init__

    def init(self, *args, **kwargs):
        build(self, *args, **kwargs)
        self.router.transport.chunk_bytes = chunk_bytes
        self.router.transport.window = window

    DSSync.__init__ = init  # in this worker process only
    return sync_cost.measure(numel, 2, steps)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=16_000_000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--setting", action="append", help="CHUNK_MB:WINDOW (repeatable)")
    a = ap.parse_args(argv)
    for setting in a.setting or ["4:2", "4:4"]:
        chunk_mb, window = (int(x) for x in setting.split(":"))
        args = (a.params, chunk_mb << 20, window, a.steps)
        r = spawn(_measure, a.workers, args=args, timeout_s=1200)[0]
        row = {
            "chunk_mb": chunk_mb,
            "window": window,
            "dssync_ms": round(r["dssync_s"] * 1e3, 1),
            "raw_exchange_ms": round(r["raw_exchange_s"] * 1e3, 1),
            "step_vs_exchange": round(r["overhead_vs_raw_exchange"], 3),
            "quartiles": [round(r["exchange_q1"], 2), round(r["exchange_q3"], 2)],
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
