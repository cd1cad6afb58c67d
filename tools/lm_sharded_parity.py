"""DS-Sync across FSDP2 replicas against FSDP2's HSDP on the `lm` workload: validation loss at
equal steps (issue 46, item 3's parity; the cluster race is not here).

Each run trains the `lm` workload (byte-level transformer, AdamW, warm-up and cosine decay,
clipping at 1.0) on a ``replicas x shards`` mesh of CPU ranks (gloo), each global rank on its
own shard of the data, for ``steps`` steps, and evaluates the validation loss on rank 0.
Settings:

    hsdp     fully_shard(model, mesh=<the 2-D mesh>): FSDP2's HSDP, gradients all-reduced
             across replicas before each step
    dssync   fully_shard(model, mesh=mesh["shard"]) and DSSync(Shuffle(2), optimizer=opt,
             process_group=mesh.get_group("replicate")): pairs of replicas, every step, the
             default for Adam (gradients averaged before the step); average_all() at the end
    dssync-every4  the same with every=4: local steps, the gradients averaged before every 4th
             step (average_grads, Adam's default) and no outer step (``--outer auto`` is none
             after Adam)

Clipping: each rank clips the gradient it holds before the step (FSDP2's DTensor norm, over its
replica's shards), then DS-Sync averages: as tools/lm_parity.py does for plain DS-Sync.

    PYTHONPATH=src python tools/lm_sharded_parity.py --mesh 2x2 --steps 320 --seeds 0 1 2 \\
        --out docs/results/lm/sharded-parity.json
    PYTHONPATH=src python tools/lm_sharded_parity.py --mesh 2x2 --steps 320 --seeds 0 1 2 \\
        --settings dssync-every4 --out docs/results/lm/sharded-parity.json --append
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from dssync import DSSync, Shuffle
from dssync.lab.cli.output import provenance
from dssync.lab.launch import spawn
from dssync.lab.train.lm_loop import train_steps
from dssync.lab.workloads import shard
from dssync.lab.workloads.lm import CLIP, LM

SETTINGS = ("hsdp", "dssync", "dssync-every4")


def train(setting: str, seed: int, steps: int, replicas: int, shards: int) -> dict:
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))
    wl = LM()
    train_set, val = wl.datasets()
    local = shard(train_set, rank, world, seed=seed)
    torch.manual_seed(seed)
    model = wl.model()
    where = mesh if setting == "hsdp" else mesh["shard"]
    for layer in model.blocks.layers:
        fully_shard(layer, mesh=where)
    fully_shard(model, mesh=where)
    opt = torch.optim.AdamW(model.parameters(), lr=wl.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def clip(o, args, kwargs):  # the workload's clipping, before DSSync's hook
        params = [p for g in o.param_groups for p in g["params"] if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, CLIP)

    opt.register_step_pre_hook(clip)
    sync = None
    if setting != "hsdp":
        group = mesh.get_group("replicate")
        every = 4 if setting == "dssync-every4" else 1
        sync = DSSync(model, Shuffle(2, seed=seed), every=every, optimizer=opt, process_group=group)
    t0 = time.perf_counter()
    train_steps(wl, model, opt, sync, local, steps, seed, rank)
    if sync is not None:
        sync.average_all()
        sync.close()
    train_s = time.perf_counter() - t0
    loss = wl.evaluate(model, val)["loss"]  # every rank: FSDP2's forward is collective
    return {"val_loss": loss, "train_s": round(train_s, 1)} if rank == 0 else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mesh", nargs="+", default=["2x2"], help="replicas x shards, e.g. 2x2 4x2")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    ap.add_argument("--steps", type=int, nargs="+", default=None, help="per mesh (1,280 / ranks)")
    ap.add_argument("--out", default=None, help="result file (JSON) to write")
    ap.add_argument(
        "--append", action="store_true", help="add to --out's rows (its runs list each command)"
    )
    ap.add_argument("--show", default=None, help="print a result file's table (markdown) and exit")
    args = ap.parse_args()
    if args.show:
        with open(args.show) as f:
            print(markdown([r for run in json.load(f)["runs"] for r in run["rows"]]))
        return
    meshes = [tuple(int(n) for n in m.split("x")) for m in args.mesh]
    steps = args.steps or [1280 // (r * s) for r, s in meshes]
    rows = []
    for (replicas, shards), n in zip(meshes, steps, strict=True):
        for seed in args.seeds:
            for setting in args.settings:
                world = replicas * shards
                res = spawn(train, world, args=(setting, seed, n, replicas, shards), timeout_s=3600)
                row = {"mesh": f"{replicas}x{shards}", "steps": n, "seed": seed}
                row = {**row, "setting": setting, **res[0]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    meta = provenance()
    meta["command"] = shlex.join(["python", "tools/lm_sharded_parity.py", *sys.argv[1:]])
    runs = [{**meta, "rows": rows}]
    if args.out and args.append and os.path.exists(args.out):
        with open(args.out) as f:
            runs = json.load(f)["runs"] + runs
    print(markdown([r for run in runs for r in run["rows"]]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"runs": runs}, f, indent=1)
            f.write("\n")


def markdown(rows: list[dict]) -> str:
    """Validation loss per seed and the mean's gap to HSDP's, per mesh."""
    seeds = sorted({r["seed"] for r in rows})
    hsdp = {(r["mesh"], r["seed"]): r["val_loss"] for r in rows if r["setting"] == "hsdp"}
    lines = [
        "| mesh | steps | setting | " + " | ".join(f"seed {s}" for s in seeds) + " | vs HSDP |"
    ]
    lines.append("|" + "---|" * (len(seeds) + 4))
    for mesh, n, setting in dict.fromkeys((r["mesh"], r["steps"], r["setting"]) for r in rows):
        mine = {
            r["seed"]: r["val_loss"] for r in rows if (r["mesh"], r["setting"]) == (mesh, setting)
        }
        cells = [f"{mine[s]:.4f}" if s in mine else "" for s in seeds]
        base = [hsdp.get((mesh, s)) for s in mine]
        gap = ""
        if setting != "hsdp" and base and all(b is not None for b in base):
            gap = f"{(sum(mine.values()) / sum(base) - 1) * 100:+.2f}%"
        lines.append(f"| {mesh} | {n} | {setting} | " + " | ".join(cells) + f" | {gap} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
