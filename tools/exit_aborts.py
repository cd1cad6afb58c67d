"""Run the examples again and again; count the runs that abort at exit.

Copies an example file (``examples/``) to a temporary folder and starts it with ``python -m
torch.distributed.run --nproc-per-node 2`` ``--runs`` times, each on a fresh port, with ``--src``
(default: this checkout's ``src``) on ``PYTHONPATH``. ``--example library`` is ``examples/quickstart.py``
(plain ``DSSync``, ending with ``dist.destroy_process_group()``), ``--example accelerate``
``examples/train_accelerate.py``, ``--example ddp`` ``examples/port_ddp.py`` (DDP alone, no dssync),
``--example both`` (the default) runs the first two ``--runs`` times each. A run
counts as an abort when a rank printed "terminate called without an active exception"; any
other failure is printed and counted apart. ``--load N`` keeps N busy processes spinning
meanwhile: on an idle machine the abort is rare, and it showed under load (CI, other tests).
Usage: ``.venv/bin/python tools/exit_aborts.py --runs 24 --load 2``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABORT = "terminate called without an active exception"
EXAMPLES = {"library": "quickstart.py", "accelerate": "train_accelerate.py", "ddp": "port_ddp.py"}


def example(name: str) -> str:
    return (ROOT / "examples" / EXAMPLES[name]).read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--example", choices=[*EXAMPLES, "both"], default="both")
    parser.add_argument("--src", default=str(ROOT / "src"), help="dssync source to import")
    parser.add_argument("--load", type=int, default=0, help="busy processes alongside")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from dssync.lab.launch import free_port, run_contained

    env = {**os.environ, "PYTHONPATH": args.src}
    names = ("library", "accelerate") if args.example == "both" else (args.example,)
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        for name in names:
            aborts, failures = runs(name, args.runs, env, free_port, run_contained)
            print(
                f"{name}: {args.runs} runs, {args.load} busy: {aborts} aborted at exit, "
                f"{failures} failed otherwise",
                flush=True,
            )
    finally:
        for p in spin:
            p.kill()
            p.wait()


def runs(name: str, count: int, env: dict[str, str], free_port, run_contained) -> tuple[int, int]:
    aborts = failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "example.py").write_text(example(name))
        for i in range(count):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--master-port",
                   str(free_port()), "--nproc-per-node", "2", "example.py"]  # fmt: skip
            done = run_contained(cmd, 120, env=env, cwd=tmp)
            if ABORT in done.stderr:
                aborts += 1
            elif done.returncode != 0:
                failures += 1
                print(f"run {i + 1} failed otherwise:\n{done.stderr[-2000:]}", flush=True)
    return aborts, failures


if __name__ == "__main__":
    main()
