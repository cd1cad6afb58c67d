"""Figures saved from the DS-Sync classes before they became options of one class (issue 25).

Each case trains a tiny model (batch norm included) for ``STEPS`` steps on 3 or 4 ranks with
fixed seeds and records, per rank, the sha256 of every parameter, buffer and momentum buffer
after the steps and again after ``average_all()``. ``old_classes.json`` was written by this
file's ``main()`` with the old classes (``AdaptiveDSSync``, ``OverlapDSSync``,
``TopoOverlapDSSync``, ``DSSync``) at the commit that added it (see git history); :func:`build`
now makes the same runs from the options of the one ``DSSync``, and ``test_old_figures.py``
checks they match bit for bit.

The bits depend on the CPU's vector unit: the fixture of 4a33592 (the old classes, on that
session's machine) did not match the unchanged code of d086da3 on an AVX512 Xeon, so the fixture
was written again there by d086da3's own code (2026-12-06), and later code must match it: the
old classes' equivalence stands from 4a33592; what this test holds now is that nothing since has
changed these runs' results.

The fixture keeps one set of figures per kind of CPU (:func:`cpu_kind`). On an AMD EPYC
(AVX512) the code of 842d5b1, whose figures matched the Xeon's, gave other bits, so that CPU's
figures were written by 842d5b1's own code (2026-12-07).

Regenerate (only to record a deliberate change of results, or on another kind of CPU with the
code of a commit whose results are known to be right; it writes this CPU kind's figures)::

    .venv/bin/python tests/strategies/old_figures.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

FIXTURE = Path(__file__).parent / "fixtures" / "old_classes.json"
STEPS = 10
# case: world size
CASES = {
    "dssync-shuffle": 4,
    "dssync-odd": 3,
    "adaptive": 4,
    "overlap": 4,
    "topo-overlap": 4,
}


def build(case: str, model: nn.Module, opt: torch.optim.Optimizer):
    """The strategy of ``case``: the old class's run, made from the one DSSync's options.

    When the fixture was written these were ``DSSync`` (the first two), ``AdaptiveDSSync(model,
    topo, replan_every=4, min_signal_s=10.0)``, ``OverlapDSSync(model, schedule=Shuffle(2,
    seed=3))`` and ``TopoOverlapDSSync(model, topo)``, each with ``optimizer=opt``.
    """
    from dssync import DSSync, Shuffle
    from dssync.schedules.topology import plan_topology_aware
    from dssync.topology import Topology

    topo = Topology(hosts=(0, 0, 1, 1), racks=(0, 0, 1, 1))
    if case == "dssync-shuffle":
        return DSSync(model, schedule=Shuffle(2, seed=1), optimizer=opt)
    if case == "dssync-odd":
        return DSSync(model, schedule=Shuffle(2, seed=2, uneven=True), optimizer=opt)
    if case == "adaptive":  # timings never exceed 10 s: the re-plan is deterministic
        # min_every=1: the re-planned crossings as they were then (whole, at every step, when
        # the uplink reads as fast as a host link); the default's least gap came later
        plan = plan_topology_aware(topo, max_every=4, min_every=1)
        sync = DSSync(model, schedule=plan, replan=4, optimizer=opt)
        sync.replanner.min_signal_s = 10.0
        return sync
    if case == "overlap":
        return DSSync(model, schedule=Shuffle(2, seed=3), overlap=True, optimizer=opt)
    if case == "topo-overlap":
        return DSSync(model, topology=topo, overlap=True, optimizer=opt)
    raise ValueError(case)


def _digest(model: nn.Module, opt: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [s["momentum_buffer"] for s in opt.state.values()]
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def run(case: str, steps: int = STEPS) -> dict:
    """One rank's run of ``case``: digests after the steps and after average_all."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = build(case, model, opt)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=g)
        y = torch.randn(8, 2, generator=g) + rank
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sync.step()
    getattr(sync, "finish", lambda: None)()
    after_steps = _digest(model, opt)
    sync.average_all()
    out = {"steps": after_steps, "average_all": _digest(model, opt)}
    getattr(sync, "close", lambda: None)()
    return out


def cpu_kind() -> str:
    """What the fixture's figures are kept by: torch's CPU capability and the CPU's vendor
    (``"AVX512 GenuineIntel"``): the same code gave other bits on an AMD EPYC than on a Xeon,
    both AVX512."""
    vendor = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{torch.backends.cpu.get_cpu_capability()} {vendor}"


def main() -> None:
    from dssync.lab.launch import spawn

    figures = {
        case: spawn(run, world, args=(case,), timeout_s=300) for case, world in CASES.items()
    }
    saved = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}
    saved[cpu_kind()] = figures  # the other kinds of CPU keep theirs
    FIXTURE.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} for {cpu_kind()}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    from old_figures import main as _main  # workers import this module by its own name

    _main()
