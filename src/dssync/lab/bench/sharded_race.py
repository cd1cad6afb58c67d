"""Time-to-target race of FSDP2's HSDP against DS-Sync across replicas, sharded ``lm``, on an
emulated cluster: one replica per rack, its shards inside the rack, the racks joined by the slow
uplinks (issue 46, item 3's race).

:func:`race` builds the cluster once and starts every run in it through torchrun on each host
(:meth:`dssync.lab.cluster.Cluster.run`), settings interleaved per seed; each rank runs
:func:`main` (``python -m dssync.lab.bench.sharded_race``). Settings (:data:`SETTINGS`):

    hsdp            fully_shard(model, mesh=<the 2-D mesh>): gradients all-reduced across all
                    replicas before every step
    dssync          fully_shard over mesh["shard"], DSSync(Shuffle(2), optimizer=opt,
                    process_group=mesh.get_group("replicate")): pairs of replicas, every step,
                    Adam's default (gradients averaged before the step)
    dssync-every4   the same with every=4 (outer none: ``--outer auto`` after Adam)

Every ``eval_every`` steps and at the end the ranks stop their clocks, take the largest training
time of any rank, and replica 0 evaluates the replicas' average (each rank's local shards
averaged over its replica group on a copy, then put back), on the first ``eval_windows``
validation windows. The time to the target is the training time at the first evaluation at or
below it; evaluations and taking the average are not timed. At the end ``dssync`` runs call
``average_all()`` (timed apart: ``final_average_s``) and every rank writes the fingerprint of the
full model it holds, so a run shows that every replica ends with one model.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

SETTINGS = {"hsdp": 0, "dssync": 1, "dssync-every4": 4}  # name: DSSync's every (0: none)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="one rank of the sharded lm race")
    ap.add_argument("--setting", choices=SETTINGS, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--shards", type=int, required=True, help="ranks per replica")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--eval-windows", type=int, default=512)
    ap.add_argument("--workload-option", action="append", default=[], help="KEY=VALUE of lm")
    ap.add_argument("--out", required=True, help="folder for rank<r>.json")
    a = ap.parse_args(argv)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    try:
        out = run(a)
        Path(a.out, f"rank{dist.get_rank()}.json").write_text(json.dumps(out) + "\n")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def replica_mesh(shards: int):
    """The (replicate, shard) mesh; each replica's ranks must share a rack (torchrun numbers the
    ranks of one host contiguously, and a spec's ``shards`` must be its ranks per rack)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world % shards:
        raise SystemExit(f"shards={shards} does not divide the {world} ranks; pick a divisor")
    mesh = init_device_mesh("cpu", (world // shards, shards), mesh_dim_names=("replicate", "shard"))
    racks: list[str | None] = [None] * world
    dist.all_gather_object(racks, os.environ.get("DSSYNC_RACK"))
    mine = mesh["shard"].mesh.flatten().tolist()
    if len({racks[r] for r in mine}) != 1:
        raise SystemExit(
            f"the ranks {mine} of one replica sit in racks {[racks[r] for r in mine]}: a replica "
            "must live inside one rack; set shards to the spec's ranks per rack"
        )
    return mesh


def run(a: argparse.Namespace) -> dict:
    from torch.distributed.fsdp import fully_shard

    from dssync import DSSync, Shuffle
    from dssync.lab.train.lm_loop import train_steps
    from dssync.lab.workloads import shard
    from dssync.lab.workloads.lm import CLIP, LM
    from dssync.strategies.sharded import local

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = replica_mesh(a.shards)
    replicas = world // a.shards
    replica = mesh["replicate"].get_local_rank()
    options = dict(kv.split("=", 1) for kv in a.workload_option)
    wl = LM(**options) if options else LM()
    train_set, val = wl.datasets()
    val = torch.utils.data.TensorDataset(*(t[: a.eval_windows] for t in val.tensors))
    data = shard(train_set, rank, world, seed=a.seed)
    torch.manual_seed(a.seed)
    model = wl.model()
    where = mesh if a.setting == "hsdp" else mesh["shard"]
    for layer in model.blocks.layers:
        fully_shard(layer, mesh=where)
    fully_shard(model, mesh=where)
    opt = torch.optim.AdamW(model.parameters(), lr=wl.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def clip(o, args, kwargs):  # each rank clips what it holds, before DSSync's hook
        params = [p for g in o.param_groups for p in g["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, CLIP)

    opt.register_step_pre_hook(clip)
    sync = None
    every = SETTINGS[a.setting]
    group = mesh.get_group("replicate")
    if every:
        sync = DSSync(
            model, Shuffle(2, seed=a.seed), every=every, optimizer=opt, process_group=group
        )
    curve: list[dict] = []
    clock = {"train_s": 0.0, "since": 0.0}

    def evaluate(step: int) -> None:
        clock["train_s"] += time.perf_counter() - clock["since"]
        slowest = torch.tensor([clock["train_s"]], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        pieces = [local(p) for p in model.parameters()]
        kept = [t.clone() for t in pieces]
        for t in pieces:  # the replicas' average, on this rank's shards
            dist.all_reduce(t, group=group)
            t.div_(replicas)
        loss = wl.evaluate(model, val)["loss"] if replica == 0 else None
        model.reshard()  # FSDP2 leaves the root unsharded after a forward without backward
        for t, k in zip(pieces, kept, strict=True):
            t.copy_(k)
        dist.barrier()
        curve.append({"step": step + 1, "train_s": round(float(slowest), 3), "loss": loss})
        clock["since"] = time.perf_counter()

    def after(step: int) -> None:
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            evaluate(step)

    clock["since"] = time.perf_counter()
    train_steps(wl, model, opt, sync, data, a.steps, a.seed, rank, after=after)
    before = full_model_sha256(model)
    final_s = 0.0
    if sync is not None:
        t0 = time.perf_counter()
        sync.average_all()
        final_s = time.perf_counter() - t0
        sync.close()
    out = {"rank": rank, "replica": replica, "rack": os.environ.get("DSSYNC_RACK")}
    out.update(model_sha256=full_model_sha256(model), before_average_sha256=before)
    if rank == 0:
        out.update(curve=curve, final_average_s=round(final_s, 3))
    return out


def full_model_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the full parameters this rank's replica holds (collective in the replica)."""
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        digest.update(name.encode())
        digest.update(p.full_tensor().detach().numpy().tobytes())
    return digest.hexdigest()


def race(
    spec,
    settings: list[str],
    seeds: list[int],
    steps: int,
    eval_every: int = 20,
    eval_windows: int = 512,
    workload_options: list[str] = (),
    work_dir: Path | None = None,
    timeout_s: float = 1800.0,
    log=print,
) -> list[dict]:
    """Run every setting for every seed on one emulated cluster built from ``spec`` (needs
    root); settings interleaved per seed, their order rotated by one each seed. One row per run:
    the rank 0 curve, every rank's model fingerprint, and the wall time of the run."""
    import tempfile

    from dssync.lab.cluster import Cluster

    shards = spec.hosts_per_rack * spec.workers_per_host
    work = Path(work_dir or tempfile.mkdtemp(prefix="sharded-race-"))
    rows = []
    with Cluster(spec) as cluster:
        for i, seed in enumerate(seeds):
            k = i % len(settings)
            for setting in settings[k:] + settings[:k]:
                out = work / f"{setting}-seed{seed}"
                out.mkdir(parents=True, exist_ok=True)
                argv = [sys.executable, "-m", "dssync.lab.bench.sharded_race"]
                argv += ["--setting", setting, "--seed", str(seed), "--steps", str(steps)]
                argv += ["--shards", str(shards), "--eval-every", str(eval_every)]
                argv += ["--eval-windows", str(eval_windows), "--out", str(out)]
                for kv in workload_options:
                    argv += ["--workload-option", kv]
                t0 = time.perf_counter()
                result = cluster.run(argv, timeout_s=timeout_s, log_dir=out / "logs")
                wall = time.perf_counter() - t0
                if not result.ok:
                    tail = "".join(p.read_text()[-2000:] for p in (out / "logs").glob("*.log"))
                    raise RuntimeError(f"{setting} seed {seed}: {result.summary()}\n{tail}")
                ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
                first = next(r for r in ranks if r["rank"] == 0)
                row = {"setting": setting, "seed": seed, "steps": steps, "wall_s": round(wall, 1)}
                row.update(curve=first["curve"], final_average_s=first["final_average_s"])
                row["models"] = sorted({r["model_sha256"] for r in ranks})
                row["models_before_average"] = sorted({r["before_average_sha256"] for r in ranks})
                row["ranks"] = len(ranks)
                rows.append(row)
                log(json.dumps({k: v for k, v in row.items() if k != "curve"}))
    return rows


if __name__ == "__main__":
    main()
