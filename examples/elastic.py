# Run with `python elastic.py`: a Lighthouse and 3 replicas on this machine, elastic DS-Sync.
# On several hosts: start `torchft_lighthouse --min_replicas 2` once, then on each host
# `python elastic.py --replica N --lighthouse http://LIGHTHOUSE_HOST:29510 --host THIS_HOST`
# (THIS_HOST: the address the other hosts reach this one at).
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def start_together(folder: str | None, n: int, replicas: int, wait_s: float = 120) -> None:
    """Locally, wait (at most ``wait_s``) until every replica is up, so the first quorum holds
    them all: a replica that comes later is healed from a live one, but one that comes after the
    run ended would wait for a quorum in vain."""
    if folder is None:
        return
    (Path(folder) / f"up{n}").touch()
    deadline = time.monotonic() + wait_s
    while len(list(Path(folder).glob("up*"))) < replicas and time.monotonic() < deadline:
        time.sleep(0.05)


def replica(
    n: int, lighthouse: str, folder: str | None, steps: int = 30, host: str = "127.0.0.1"
) -> None:
    # [start:replica]
    from dssync.elastic import ElasticDSSync, ReplicaManager

    torch.manual_seed(n)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    manager = ReplicaManager(f"replica_{n}", lighthouse, min_replicas=2, host=host)
    sync = ElasticDSSync(model, manager, optimizer=opt)  # pairs of the live replicas
    # [end:replica]
    start_together(folder, n, 3)
    # [start:loop]
    w = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    while sync.steps < steps:  # a replica that joins late is handed the others' step count
        x = torch.randn(32, 8)
        ((model(x) - x @ w) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        sync.step()
    sync.average_all()  # one average over the replicas alive now
    sync.close()
    # [end:loop]
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(1))
    print(f"replica {n}: loss {((model(x) - x @ w) ** 2).mean().item():.6f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=int)
    ap.add_argument("--lighthouse")
    ap.add_argument("--folder", help="where local replicas say they are up")
    ap.add_argument("--host", default="127.0.0.1", help="the address others reach this host at")
    args = ap.parse_args()
    if args.replica is not None:
        return replica(args.replica, args.lighthouse, args.folder, host=args.host)
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=10_000)
    folder = tempfile.mkdtemp()
    cmd = [sys.executable, __file__, "--lighthouse", lighthouse.address(), "--folder", folder]
    procs = [subprocess.Popen([*cmd, "--replica", str(n)]) for n in range(3)]
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
        lighthouse.shutdown()
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
