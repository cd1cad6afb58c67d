"""`make gpu-check`: does dssync train and average correctly on a CUDA machine?

    PYTHONPATH=src python3 tools/gpu_check.py

Runs from the source tree on a bare interpreter (torch, scikit-learn, click, rich, tqdm,
matplotlib; dssync itself need not be installed) and prints one line per check:

1. world size 1 on nccl: 50 steps of `dssync train --device cuda` on the digits data;
2. gloo with a model on CUDA: refused when DSSync is built, naming nccl and set_device (gloo's
   point-to-point messages cannot carry CUDA tensors);
3. the library quickstart (examples/quickstart.py, shown in the README), as written, with one
   rank per GPU (it picks cuda:LOCAL_RANK and nccl);
4. the int8 wire and its groups of 4 on the CPU path the CUDA machine also has (the codec's
   bits are the same on either device: tests/comm/test_wire.py);
5. no host sync on the device's share of an averaging: a tag built, its finite flag reduced and
   written, and an int8 encode with error feedback and decode, under
   ``torch.cuda.set_sync_debug_mode("error")``;
6. the int8 and bf16 codecs' encode-and-decode rate on 256M float32 elements (GB/s of input).

What it cannot check on one GPU: nccl point-to-point and a lost peer on nccl need two ranks,
each with a GPU of its own (nccl refuses two on one); the tests hold those rules on a CPU
through the ``nccl_like`` stand-in (tests/testing/).

Exits non-zero when any check fails. On a machine without CUDA it says so in one line and exits 0.
Every check has a time limit; the whole run stays under 5 minutes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
QUICKSTART = ROOT / "examples" / "quickstart.py"

# Appended to the quickstart: each rank prints a digest of its final parameters.
DIGEST_LINES = """
import hashlib
digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters()))
print(f"rank {dist.get_rank()} model {digest.hexdigest()} device {next(model.parameters()).device}", flush=True)
"""
END = "dist.destroy_process_group()"


def run(cmd: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` with src/ on the path; on timeout kill its whole process group, then raise."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
    }
    from dssync.lab.launch import run_contained  # src/ is on this script's path (see main)

    try:
        return run_contained(cmd, timeout, env=env, cwd=cwd)
    except TimeoutError:
        raise RuntimeError(f"did not finish within {timeout:.0f} s") from None


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(no output)"


def check_train_nccl() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        r = run(
            [
                sys.executable,
                "-m",
                "dssync",
                "train",
                "--workload",
                "digits",
                "--workers",
                "1",
                "--group-size",
                "1",
                "--device",
                "cuda",
                "--epochs",
                "2",
                "--max-steps",
                "50",
                "--quiet",
                "--json",
                str(out),
            ],
            timeout=150,
        )
        if r.returncode != 0:
            raise RuntimeError(f"exit {r.returncode}: {last_line(r.stderr)}")
        s = json.loads(out.read_text())
    if s["steps"] != 50 or not s["device"].startswith("cuda"):
        raise RuntimeError(f"ran {s['steps']} steps on {s['device']}, expected 50 on cuda")
    if s["final_accuracy"] < 0.8:
        raise RuntimeError(f"accuracy {s['final_accuracy']:.3f} after 50 steps, expected >= 0.8")
    return f"50 steps on {s['device']}, accuracy {s['final_accuracy']:.3f}, {s['iter_time_s'] * 1000:.1f} ms/step"


def _digest(module) -> str:
    h = hashlib.sha256()
    for t in module.state_dict().values():
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _ranks_on_one_gpu(wire: str = "fp32", device_type: str = "cuda") -> dict:
    """Every rank of the world on one device, in one DS-Sync group of them all when there are
    more than two (a compressed group of three or more averages in two stages)."""
    import torch
    import torch.distributed as dist

    import dssync

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    torch.manual_seed(rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    schedule = dssync.Shuffle(group_size=min(world, 4), seed=0)
    sync = dssync.DSSync(model, schedule=schedule, optimizer=opt, wire=wire)
    if any(p.device != device for p in model.parameters()):
        raise RuntimeError(f"DSSync moved the parameters off {device}")
    mismatches = 0
    for _ in range(20):
        x, y = torch.randn(32, 16, device=device), torch.randint(0, 4, (32,), device=device)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sync.step()
        seen = [None] * world
        dist.all_gather_object(seen, _digest(model))
        mismatches += len(set(seen)) != 1
    sync.average_all()
    final = [None] * world
    dist.all_gather_object(final, _digest(model))
    return {
        "mismatches": mismatches,
        "final": final,
        "device": str(next(model.parameters()).device),
    }


def _refused_on_gloo() -> str:
    import torch

    import dssync

    try:
        dssync.DSSync(torch.nn.Linear(4, 2).to("cuda:0"))
    except dssync.UsageError as e:
        return str(e)
    return ""


def check_gloo_cuda() -> str:
    import torch.multiprocessing  # noqa: F401 - spawn needs it importable in the children

    from dssync.lab.launch import spawn

    said = spawn(_refused_on_gloo, 2, timeout_s=150, collective_timeout_s=60, backend="gloo")
    if not all("nccl" in s and "set_device" in s for s in said):
        raise RuntimeError(f"gloo with a CUDA model was not refused with the fix: {said}")
    return "refused on both ranks, naming nccl and set_device"


def check_int8_cuda(ranks: int = 2, device_type: str = "cpu") -> str:
    from dssync.lab.launch import spawn

    r = spawn(
        _ranks_on_one_gpu, ranks, args=("int8", device_type), timeout_s=150,
        collective_timeout_s=60, backend="gloo",
    )[0]  # fmt: skip
    how = "pair" if ranks == 2 else f"group-of-{ranks} (two-stage)"
    if not r["device"].startswith(device_type) or r["mismatches"] or len(set(r["final"])) != 1:
        raise RuntimeError(
            f"int8 wire on {r['device']}: {r['mismatches']} of 20 {how} averagings left the "
            "ranks apart"
        )
    return f"int8 wire: 20 {how} averagings and average_all() bit-identical on {r['device']}"


def check_int8_groups_cuda() -> str:
    return check_int8_cuda(ranks=4)


def check_no_host_sync() -> str:
    import torch

    from dssync.comm.tags import STEP, Tag, finite_of, layout_of
    from dssync.comm.wire import codec_for, encode_with_feedback

    device = torch.device("cuda", torch.cuda.current_device())
    buffers = [torch.randn(1 << 20, device=device), torch.randn(4096, device=device)]
    residual = torch.zeros_like(buffers[0])
    codec = codec_for("int8")
    tag = Tag(STEP, 3, layout_of(buffers))
    tag.tensor(device)  # warm-up: the first pinned buffer and kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            sent = tag.tensor(device, finite_of(buffers))
            msg, mine = encode_with_feedback(codec, buffers[0], residual)
            back = codec.decode(msg, buffers[0].numel(), buffers[0].dtype)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    if int(sent[3]) != 1 or not torch.equal(back, mine):
        raise RuntimeError("the finite flag or the int8 round trip came out wrong")
    return "tag, finite flag and int8 round trip with no host sync (sync debug mode 'error')"


def check_codec_rate() -> str:
    import torch

    from dssync.comm.wire import codec_for

    device = torch.device("cuda", torch.cuda.current_device())
    v = torch.randn(256 << 20, device=device)
    rates = []
    for name in ("int8", "bf16"):
        codec = codec_for(name)
        msg, _ = codec.encode_decoded(v)  # warm-up
        codec.decode(msg, v.numel(), v.dtype)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            msg, _ = codec.encode_decoded(v)
            codec.decode(msg, v.numel(), v.dtype)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000 / 5
        rates.append(f"{name} {v.numel() * 4 / seconds / 1e9:.0f} GB/s")
    return "encode and decode, 256M elements: " + ", ".join(rates)


def library_example(path: Path = QUICKSTART) -> str:
    """The library quickstart, examples/quickstart.py (the README shows it)."""
    return path.read_text()


def run_example(
    code: str, folder: Path, ranks: int = 2, timeout: float = 150
) -> subprocess.CompletedProcess:
    """The example with :data:`DIGEST_LINES` before its end under torchrun with ``ranks`` ranks."""
    script = folder / "example.py"
    head, _, _ = code.partition(END)  # the digest needs the group: it goes before the end
    script.write_text(head + DIGEST_LINES + END + "\n")
    return run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(script),
        ],
        timeout=timeout,
        cwd=folder,
    )


def check_readme() -> str:
    import torch

    ranks = torch.cuda.device_count()  # one rank per GPU: nccl refuses two on one
    with tempfile.TemporaryDirectory() as tmp:
        r = run_example(library_example(), Path(tmp), ranks=ranks)
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {last_line(r.stderr)}")
    found = sorted(re.findall(r"rank (\d+) model ([0-9a-f]{64}) device (\S+)", r.stdout))
    if len(found) != ranks or len({f[1] for f in found}) != 1:
        raise RuntimeError(f"ranks did not end with one model: {found}")
    if not found[0][2].startswith("cuda"):
        raise RuntimeError(f"the example trained on {found[0][2]}, not CUDA")
    return f"{ranks} rank(s), one per GPU, on {found[0][2]}; one model after average_all()"


CHECKS = [
    ("train, world size 1, nccl, --device cuda", check_train_nccl),
    ("gloo with a CUDA model is refused, naming the fix", check_gloo_cuda),
    ("library quickstart on CUDA, nccl", check_readme),
    ("DS-Sync int8 wire, pairs", check_int8_cuda),
    ("DS-Sync int8 in groups of 4 (two stages)", check_int8_groups_cuda),
    ("no host sync in an averaging's device work", check_no_host_sync),
    ("codec rate on the GPU", check_codec_rate),
]


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(
            f"gpu-check: no CUDA device on this machine (torch {torch.__version__}); nothing to check"
        )
        return 0
    failed = 0
    for name, check in CHECKS:
        t0 = time.monotonic()
        try:
            detail = check()
            print(f"ok    {name}: {detail} ({time.monotonic() - t0:.0f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - each check reports its own failure in one line
            failed += 1
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            print(f"FAIL  {name}: {first} ({time.monotonic() - t0:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(SRC))
    sys.exit(main())
