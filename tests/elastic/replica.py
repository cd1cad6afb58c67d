"""One replica of the elastic tests, run as its own process (``python replica.py --help``).

It trains a tiny linear model on its own random data with ElasticDSSync and writes one JSON
line per step to ``--log``: its pid, step, time, and what the averaging did. With ``--final``
it ends with a global average and writes the final parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch

from dssync import hashing
from dssync.elastic import ElasticDSSync, ReplicaManager
from dssync.elastic import sync as elastic_sync


def fingerprint(module: torch.nn.Module) -> int:
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    return hashing.fingerprint(flat.numpy().tobytes().hex())


def die_in_averaging(first: int) -> None:
    """Wrap ElasticDSSync's group averaging so that this process dies inside one."""
    real = elastic_sync.average_in_group

    def dying(pg, group, rank, flats, header, timeout_s):
        if header["averaging"] >= first and len(group) > 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(pg, group, rank, flats, header, timeout_s)

    elastic_sync.average_in_group = dying


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--lighthouse", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--min-replicas", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=20.0)
    ap.add_argument("--step-s", type=float, default=0.0, help="sleep per step (compute time)")
    ap.add_argument("--final", action="store_true", help="average_all at the end")
    ap.add_argument("--go", help="wait until this file exists before the first step")
    ap.add_argument(
        "--manager-first",
        action="store_true",
        help="start the manager before --go, so the first quorum waits for this replica",
    )
    ap.add_argument("--deadline-s", type=float, default=240.0, help="end the process by then")
    ap.add_argument(
        "--die-in-averaging",
        type=int,
        help="SIGKILL this process inside the first averaging from this one on where it has a "
        "partner: after the quorum formed with it, before its group exchanges",
    )
    args = ap.parse_args()
    if args.die_in_averaging is not None:
        die_in_averaging(args.die_in_averaging)
    signal.alarm(int(args.deadline_s))  # whatever happens to the test, this process ends
    torch.set_num_threads(1)
    torch.manual_seed(100 + args.replica)  # every replica starts apart
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    target = torch.randn(8, 4)

    def manager() -> ReplicaManager:
        return ReplicaManager(
            f"replica_{args.replica}",
            args.lighthouse,
            min_replicas=args.min_replicas,
            timeout_s=args.timeout_s,
            quorum_timeout_s=60.0,
        )

    # heard by the Lighthouse before its first quorum, which then waits for this replica too
    early = manager() if args.manager_first else None
    with open(args.log, "a") as log:  # imported: ready to join when told (--go)
        log.write(json.dumps({"pid": os.getpid(), "replica": args.replica, "ready": True}) + "\n")
    while args.go and not os.path.exists(args.go):
        time.sleep(0.05)
    manager = early or manager()
    sync = ElasticDSSync(model, manager, optimizer=opt)
    with open(args.log, "a") as log:

        def write(**record) -> None:
            log.write(json.dumps({"pid": os.getpid(), "replica": args.replica, **record}) + "\n")
            log.flush()

        # A probe beside ElasticDSSync's state, through torchft's own hooks: the source says
        # what it served, the healed replica what it holds right after loading (dssync's state
        # was registered first, so it is loaded first).
        def serve() -> dict:
            return {"replica": args.replica, "params": fingerprint(model), "steps": sync.steps}

        def heal(served: dict) -> None:
            write(healed_from=served, holds=fingerprint(model), steps_after=sync.steps)

        manager.register_state_dict_fn("probe", heal, serve)

        while sync.steps < args.steps:
            x = torch.randn(16, 8)
            loss = ((model(x) - x @ target) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(args.step_s)
            sync.step()
            a = sync.history[-1]
            write(
                step=sync.steps,
                time=time.time(),
                averaging=a.averaging,
                members=a.members,
                group=a.group,
                outcome=a.outcome,
                healed=a.healed,
                lost={str(k): v for k, v in a.lost.items()},
                params=fingerprint(model),
            )
        if args.final:
            sync.average_all()
            a = sync.history[-1]
            write(
                final=[p.detach().reshape(-1).tolist() for p in model.parameters()],
                members=a.members,
                outcome=a.outcome,
                params=fingerprint(model),
            )
    sync.close()


if __name__ == "__main__":
    main()
