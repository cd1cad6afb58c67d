"""DS-Sync with AdamW against DDP on the `lm` workload: validation loss at equal steps.

Each run trains the `lm` workload (byte-level transformer, AdamW, warm-up and cosine decay,
clipping at 1.0) on ``world`` ranks, each on its own shard, for ``steps`` steps, then averages
globally (``average_all``) and evaluates the validation loss on rank 0. Settings:

    ddp           DDP (gradients all-reduced before each step)
    old           DSSync(Shuffle(2), optimizer=opt, average_grads=False): parameters and moments
                  averaged after each rank's own step (DS-Sync before the fix)
    grads         DSSync(Shuffle(2), optimizer=opt, average_grads=True), the second moment's
                  correction off: gradients, parameters and moments averaged in one message
                  before the step
    grads-v       as grads, with the correction of the second moment (the default for Adam
                  until 2026-12-07; the same as grads in one pair)
    grads-nomom   as grads, the moments not averaged (optimizer state stays per rank)
    grads-v-nomom as grads-v, the moments not averaged: parameters and gradients only (2P); the
                  default for Adam since 2026-12-07 (what DSSync(optimizer=AdamW(...)) runs)
    noopt         DSSync(Shuffle(2)) without optimizer= (parameters only, after the step)
    local16       every=16, parameters and moments averaged (average_grads=False)
    local16-grads every=16, average_grads=True with the correction (the default for Adam)
    local16-nest  every=16 with outer=nesterov() (DiLoCo's outer step), average_grads=False
    local4-grads  every=4, the default for Adam (optimizer=, average_grads on)
    preset-local  the `dssync-local` preset as `dssync train` runs it with Adam: every=4,
                  outer=nesterov(), optimizer= (average_grads on)
    grads-v0      as grads-v without its bound at k/W (only: never below this step's own input)
    butterfly     as grads-v on Butterfly(2) (partners cycle: the exact mean every log2 N steps)
    global        as grads-v on Global() (one group of all ranks: DDP's step, clipping aside)
    grads-v1      as grads-v with the correction's bound before (each step's input to the second
                  moment at least k/W of the squared mean, not the running average)
    ddp-half      DDP on half of each rank's batch (the gradient noise of a pair's mean at
                  twice the ranks: what the effective batch alone would cost)
Every DSSync setting but the two ``nomom`` ones sends the optimizer's state in every averaging.

Rows of DSSync settings carry ``consensus``: the mean consensus distance
(``dssync.consensus_distance``) after every 16th step; every row carries ``clipped``: the
fraction of steps at which rank 0's clipping scaled a gradient down.

One thread per rank. Prints a table and writes a result file with the command, date and commit:

    PYTHONPATH=src python tools/lm_parity.py --worlds 4 --steps 320 --seeds 0 1 2 \\
        --settings ddp old grads grads-v --out docs/results/lm/parity.json
    PYTHONPATH=src python tools/lm_parity.py --worlds 2 --steps 320 --seeds 0 1 2 --settings \\
        ddp old grads local16 local16-grads local16-nest --out docs/results/lm/parity.json --append
    PYTHONPATH=src python tools/lm_parity.py --worlds 8 --steps 160 --seeds 0 1 2 \\
        --settings ddp grads-v --out docs/results/lm/parity.json --append
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
from torch.nn.parallel import DistributedDataParallel as DDP

from dssync import Butterfly, DSSync, Global, Shuffle, consensus_distance, nesterov
from dssync.lab.cli.output import provenance
from dssync.lab.launch import spawn
from dssync.lab.train.lm_loop import train_steps
from dssync.lab.workloads import shard
from dssync.lab.workloads.lm import CLIP, LM

SETTINGS = (
    "ddp",
    "old",
    "grads",
    "grads-nomom",
    "grads-v-nomom",
    "grads-v",
    "noopt",
    "local16",
    "local16-grads",
    "local16-nest",
    "local4-grads",
    "preset-local",
    "butterfly",
    "global",
    "grads-v1",
    "ddp-half",
    "grads-v0",
)


def strategy(setting: str, model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int):
    """(what forward runs on, the DSSync or None)."""
    if setting.startswith("ddp"):
        return DDP(model), None
    every = 16 if setting.startswith("local16") else 4 if "local" in setting else 1
    schedule = {"butterfly": Butterfly(2), "global": Global()}.get(setting, Shuffle(2, seed=seed))
    kw = dict(schedule=schedule, every=every)
    if setting == "noopt":
        return model, DSSync(model, **kw, average_grads=False)
    corrected = ("grads-v", "grads-v1", "local16-grads", "local4-grads", "preset-local")
    corrected += ("butterfly", "global", "grads-v0", "grads-v-nomom")
    grads = setting in ("grads", "grads-nomom", *corrected)
    outer = nesterov() if setting in ("local16-nest", "preset-local") else None
    sync = DSSync(model, **kw, optimizer=opt, average_grads=grads, outer=outer)
    if sync.before_step is not None:  # the correction of the second moment: on by default
        sync.before_step.correct_v = setting in corrected
        sync.before_step._bound_each_input = setting == "grads-v1"
        sync.before_step._floor = setting != "grads-v0"
    if not setting.endswith("nomom"):  # the moments in every averaging, as until 2026-12-07
        sync._state_travels = lambda kind: True
    return model, sync


def train(setting: str, seed: int, steps: int) -> dict:
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    wl = LM()
    train_set, val = wl.datasets()
    local = shard(train_set, rank, world, seed=seed)
    torch.manual_seed(seed)
    model = wl.model()
    opt = torch.optim.AdamW(model.parameters(), lr=wl.lr, betas=(0.9, 0.95), weight_decay=0.1)
    norms: list[float] = []

    def clip(o, args, kwargs):  # the workload's clipping (lm.clip_before_step), its norm kept
        params = [p for g in o.param_groups for p in g["params"] if p.grad is not None]
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, CLIP)))

    opt.register_step_pre_hook(clip)  # before DSSync's: each rank clips its own gradient
    fwd, sync = strategy(setting, model, opt, seed)
    half = wl.batch_size // 2 if setting == "ddp-half" else wl.batch_size
    distances = []
    probe, at_70 = int(0.7 * steps), None

    def after(step: int) -> None:
        nonlocal at_70
        if step + 1 == probe and setting == "ddp" and rank == 0:  # DDP: replicas equal
            at_70 = wl.evaluate(model, val)["loss"]
        if sync is not None and step % 16 == 15:
            distances.append(consensus_distance(model))

    t0 = time.perf_counter()
    train_steps(wl, model, opt, sync, local, steps, seed, rank, forward=fwd, take=half, after=after)
    if sync is not None:
        sync.average_all()
        sync.close()
    train_s = time.perf_counter() - t0
    if rank != 0:
        return {}
    out = {"val_loss": wl.evaluate(model, val)["loss"], "train_s": round(train_s, 1)}
    out["clipped"] = round(sum(n > CLIP for n in norms) / max(len(norms), 1), 3)
    if distances:
        out["consensus"] = float(f"{sum(distances) / len(distances):.3g}")
    return out if at_70 is None else {**out, "val_loss_at_70pct": at_70}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--settings", nargs="+", default=["ddp", "old", "grads"], choices=SETTINGS)
    ap.add_argument(
        "--steps",
        type=int,
        nargs="+",
        default=None,
        help="steps per world size (default: 1,280 / world: 4 epochs' worth of 2)",
    )
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
    steps = args.steps or [1280 // w for w in args.worlds]
    rows = []
    for world, n in zip(args.worlds, steps, strict=True):
        for seed in args.seeds:
            for setting in args.settings:
                res = spawn(train, world, args=(setting, seed, n), timeout_s=1800)[0]
                row = {"world": world, "steps": n, "seed": seed, "setting": setting, **res}
                rows.append(row)
                print(json.dumps(row), flush=True)
    meta = provenance()
    meta["command"] = shlex.join(["python", "tools/lm_parity.py", *sys.argv[1:]])
    runs = [{**meta, "rows": rows}]
    if args.out and args.append and os.path.exists(args.out):
        with open(args.out) as f:
            runs = json.load(f)["runs"] + runs
    print_table([r for run in runs for r in run["rows"]])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"runs": runs}, f, indent=1)
            f.write("\n")


def print_table(rows: list[dict]) -> None:
    """Per world size and setting: the loss per seed and the mean's gap to DDP's."""
    ddp = {(r["world"], r["seed"]): r["val_loss"] for r in rows if r["setting"] == "ddp"}
    print(f"{'world':>5} {'steps':>5} {'setting':<14} {'val loss per seed':<28} {'vs DDP':>8}")
    keys = dict.fromkeys((r["world"], r["steps"], r["setting"]) for r in rows)
    for world, n, setting in keys:
        mine = [r for r in rows if (r["world"], r["setting"]) == (world, setting)]
        losses = " / ".join(f"{r['val_loss']:.4f}" for r in mine)
        base = [ddp.get((world, r["seed"])) for r in mine]
        gap = ""
        if all(b is not None for b in base):
            gap = f"{(sum(r['val_loss'] for r in mine) / sum(base) - 1) * 100:+.2f}%"
        print(f"{world:>5} {n:>5} {setting:<14} {losses:<28} {gap:>8}")


def markdown(rows: list[dict]) -> str:
    """The table for docs/guide/adam.md: validation loss per seed, mean gap to DDP's."""
    ddp = {
        (r["world"], r["steps"], r["seed"]): r["val_loss"] for r in rows if r["setting"] == "ddp"
    }
    seeds = sorted({r["seed"] for r in rows})
    head = "| ranks | steps | setting | " + " | ".join(f"seed {s}" for s in seeds) + " | vs DDP |"
    lines = [head, "|" + "---|" * (len(seeds) + 4)]
    for world, n, setting in dict.fromkeys((r["world"], r["steps"], r["setting"]) for r in rows):
        mine = {
            r["seed"]: r
            for r in rows
            if (r["world"], r["steps"], r["setting"]) == (world, n, setting)
        }
        cells = [f"{mine[s]['val_loss']:.4f}" if s in mine else "" for s in seeds]
        base = [ddp.get((world, n, s)) for s in mine]
        gap = ""
        if setting != "ddp" and all(b is not None for b in base):
            ours = sum(r["val_loss"] for r in mine.values())
            gap = f"{(ours / sum(base) - 1) * 100:+.2f}%"
        lines.append(f"| {world} | {n} | {setting} | " + " | ".join(cells) + f" | {gap} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
