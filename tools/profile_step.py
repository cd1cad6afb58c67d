"""Where a DS-Sync step's time goes beyond the bytes: ``DSSync.step()`` against a raw exchange
with this step's partner and a raw all_reduce (and divide), on gloo ranks over loopback, timed
in turns; between them, the exchange after the finiteness check's read of the buffer
(``checked``) and the one transport's average of the model's bucket without the strategy above
it (``transport``). Wall and CPU time (this process's, gloo's threads included) per step; with
``--profile``, rank 0's steps under cProfile, the functions by their own time (``ROWS``).

    PYTHONPATH=src .venv/bin/python tools/profile_step.py --workers 4 --params 1000000 --profile

At 2 workers the pair is the whole world: the step takes the all-reduce path, not the pair's.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world: int, port: int, a: argparse.Namespace) -> None:
    import dssync
    from dssync.comm.exchange import swap_ops
    from dssync.comm.tags import STEP, Tag, finite_of, layout_of
    from dssync.schedules import group_of

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.nn.Linear(a.params // 1000, 1000, bias=False)
    schedule = dssync.Shuffle(group_size=2, seed=0)
    sync = dssync.DSSync(model, schedule=schedule)
    flat, recv = torch.randn(a.params), torch.empty(a.params)

    def exchange() -> None:  # with the partner of the step DSSync takes next
        g = group_of(schedule.partition(sync.averagings, world), rank)
        peer = g[0] if g[1] == rank else g[1]
        for w in dist.batch_isend_irecv(swap_ops(recv, flat, peer)):
            w.wait()
        flat.add_(recv).div_(2)

    def checked() -> None:  # what the step's finiteness check reads, then the exchange
        flat.sum().isfinite()
        exchange()

    buckets = sync._buckets.buffers  # one up to 25 MB (6.5M fp32 parameters)

    def transport() -> None:  # the same averaging, from the transport down
        g = group_of(schedule.partition(sync.averagings, world), rank)
        tag = Tag(STEP, sync.averagings, layout_of(buckets))
        sync.router.transport.average(buckets, g, tag, 60.0, finite_of(buckets))

    def all_reduce() -> None:
        dist.all_reduce(flat)
        flat.div_(world)

    fns = {
        "step": sync.step,
        "transport": transport,
        "checked": checked,
        "exchange": exchange,
        "all_reduce": all_reduce,
    }
    for _ in range(10):
        for fn in fns.values():
            fn()
    dist.barrier()
    total, cpu = dict.fromkeys(fns, 0.0), dict.fromkeys(fns, 0.0)
    for i in range(a.steps):
        for name, fn in list(fns.items())[:: 1 if i % 2 else -1]:
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            total[name] += time.perf_counter() - t0
            cpu[name] += time.process_time() - c0
    ms = {k: round(v / a.steps * 1e3, 3) for k, v in total.items()}
    cpu_ms = {k: round(v / a.steps * 1e3, 3) for k, v in cpu.items()}
    print(
        f"rank {rank}: ms per step {ms}; CPU ms per step {cpu_ms}; step / exchange "
        f"{total['step'] / total['exchange']:.3f}, step / all_reduce "
        f"{total['step'] / total['all_reduce']:.3f}",
        flush=True,
    )
    profile = cProfile.Profile() if a.profile and rank == 0 else None
    if profile is not None:
        profile.enable()
    for _ in range(a.steps):
        sync.step()
    if profile is not None:
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(int(os.environ.get("ROWS", "25")))
    sync.close()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--params", type=int, default=1_000_000, help="a multiple of 1,000")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--profile", action="store_true", help="rank 0's steps under cProfile")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a.workers, port, a), nprocs=a.workers)


if __name__ == "__main__":
    main()
