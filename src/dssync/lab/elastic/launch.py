"""Start an elastic run on this machine: a Lighthouse, one process per replica, restarts.

:func:`run_elastic` is what ``dssync train --elastic`` runs. It starts torchft's Lighthouse as a
process of its own (or uses one elsewhere: ``lighthouse=URL``), starts ``replicas`` replica processes
(:mod:`dssync.lab.elastic.replica`), and watches them as an orchestrator would: a replica that
dies is started again under its number after ``restart_delay_s`` (it joins the running job and
is healed from a live peer), unless a replica has already finished (the run is ending: a
newcomer would wait for a quorum in vain) or it died before its first step (a new process would
fail the same way: a Lighthouse that cannot be reached, say). The run succeeds when at least ``min_replicas``
replicas finished. Every process it started is killed when it returns, raises, times out or is
interrupted (Ctrl-C; ``dssync train`` turns SIGTERM into the same). With
``chaos=Chaos(every_s=25)`` it is also the punisher: it SIGKILLs a random replica that has
stepped about every 25 s (the lost one is restarted like any other).

Example::

    summary = run_elastic(TrainConfig(workload="digits", sync="elastic-dssync"), replicas=3)
    summary["elastic"]["finished"]     # [0, 1, 2]
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dssync.errors import SyncError, UsageError
from dssync.lab.config import TrainConfig

READY_WAIT_S = 300.0  # the longest the replicas may take to load their data before the start
HOST_ENV = "DSSYNC_REPLICA_HOST"  # the address the others reach a replica at
HEARTBEAT_MS = 2000  # a replica silent this long is left out of the next quorum (torchft: 5000)


class ElasticRunFailed(SyncError):
    """Fewer than ``min_replicas`` replicas finished (or one failed before training); the
    message says what ended each, and the tails of their logs went to ``say`` before."""


@dataclass
class Replica:
    """One replica number and the process that runs it now."""

    number: int
    proc: subprocess.Popen | None = None
    starts: int = 0
    restart_at: float | None = None  # when a lost one is started again
    ends: list[str] = field(default_factory=list)  # how each of its processes ended
    proc_pid: int = 0  # the pid of its last process
    told: bool = False  # the tail of its log was said
    host: int = 0  # where it runs: its index in the run's Hosts


@dataclass
class Chaos:
    """Kill a random live replica every ``every_s`` seconds, give or take ``spread`` of it
    (uniform; 25 s and 0.2: every 20 to 30 s), drawn from ``seed``: torchft's punisher as an
    option of the launcher. No kill leaves fewer than ``min_replicas`` replica processes
    running (a restarted one still starting counts: the others may then wait for it at their
    next quorum), none comes before every replica has stepped or once one has finished; each kill goes to
    ``summary["elastic"]["chaos_kills"]``.

    Example::

        run_elastic(cfg, replicas=4, chaos=Chaos(every_s=30, seed=1))
    """

    every_s: float
    spread: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.every_s <= 0:
            raise UsageError(f"chaos every_s={self.every_s} must be > 0 seconds")
        if not 0 <= self.spread < 1:
            raise UsageError(f"chaos spread={self.spread} must be in [0, 1)")
        self.rng = random.Random(self.seed)
        self.next_at: float | None = None
        self.kills: list[dict[str, Any]] = []

    def gap(self) -> float:
        return self.every_s * self.rng.uniform(1 - self.spread, 1 + self.spread)


@dataclass(kw_only=True)
class Hosts:
    """Where an elastic run's processes run: replica ``n`` on host ``n % len(address)``, the
    Lighthouse on host 0. Each host is a command prefix, the environment its processes add, and
    the address the others reach it at. The default is this machine alone: no prefix, and the
    address in ``DSSYNC_REPLICA_HOST`` if set (a replica of a run spread over machines with
    ``lighthouse=URL``), else ``127.0.0.1``. :meth:`on_cluster` places one replica per host of
    an emulated cluster.

    Example::

        with Cluster(load_cluster("s1-homogeneous")) as cluster:
            run_elastic(cfg, replicas=8, hosts=Hosts.on_cluster(cluster))
    """

    prefix: list[list[str]] = field(default_factory=lambda: [[]])
    env: list[dict[str, str]] = field(default_factory=lambda: [{}])
    address: list[str] = field(default_factory=lambda: [os.environ.get(HOST_ENV) or "127.0.0.1"])

    def __post_init__(self) -> None:
        sizes = {len(self.prefix), len(self.env), len(self.address)}
        if len(sizes) != 1 or 0 in sizes:
            raise UsageError(
                f"Hosts needs one prefix, env and address per host, at least one host (got "
                f"{len(self.prefix)}, {len(self.env)} and {len(self.address)})"
            )

    @classmethod
    def on_cluster(cls, cluster: Any) -> Hosts:
        """Every host of ``cluster`` (a :class:`~dssync.lab.cluster.Cluster` that is up): its
        namespace (``ip netns exec``), its interface for gloo, its address."""
        n = cluster.spec.num_hosts
        return cls(
            prefix=[["ip", "netns", "exec", cluster.host_ns(h)] for h in range(n)],
            env=[{"GLOO_SOCKET_IFNAME": cluster.host_ifname(h)} for h in range(n)],
            address=[cluster.address_of(h) for h in range(n)],
        )

    def of(self, replica: int) -> int:
        """The host replica ``replica`` runs on."""
        return replica % len(self.address)


LIGHTHOUSE = """
import sys
from torchft.coordination import LighthouseServer
s = LighthouseServer(bind="[::]:0", min_replicas={min_replicas}, join_timeout_ms={join_ms},
                     heartbeat_timeout_ms={heartbeat_ms})
print(s.address().rsplit(":", 1)[1], flush=True)  # its port: the host is the launcher's
sys.stdin.read()  # until the launcher closes it or ends
"""


class Lighthouse:
    """torchft's Lighthouse as a process of its own (its log in ``folder/lighthouse.err``);
    :attr:`address` is what replicas connect to. It ends when :meth:`close` is called or when
    the process that started it ends (its stdin closes).

    Example::

        house = Lighthouse(folder, min_replicas=2)
        house.address      # "http://host:port"
        house.close()
    """

    def __init__(
        self,
        folder: Path,
        min_replicas: int,
        join_timeout_ms: int = 60_000,
        heartbeat_ms: int = HEARTBEAT_MS,
        wait_s: float = 60.0,
        hosts: Hosts | None = None,
    ) -> None:
        hosts = hosts or Hosts()
        code = LIGHTHOUSE.format(
            min_replicas=min_replicas, join_ms=join_timeout_ms, heartbeat_ms=heartbeat_ms
        )
        out = folder / "lighthouse.out"
        self.proc = subprocess.Popen(
            [*hosts.prefix[0], sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=open(out, "w"),  # noqa: SIM115 - the child keeps it
            stderr=open(folder / "lighthouse.err", "w"),  # noqa: SIM115
            start_new_session=True,
        )
        deadline = time.monotonic() + wait_s
        try:
            while not (text := out.read_text().strip()):
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the Lighthouse ended at its start:\n{_tail(folder / 'lighthouse.err')}"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the Lighthouse gave no address within {wait_s:.0f} s")
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise
        self.address = f"http://{hosts.address[0]}:{text.splitlines()[0]}"

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def run_elastic(
    cfg: TrainConfig,
    replicas: int,
    min_replicas: int | None = None,
    restart_delay_s: float = 5.0,
    lighthouse: str | None = None,
    timeout_s: float | None = None,
    folder: str | os.PathLike | None = None,
    say: Callable[[str], None] = print,
    heartbeat_ms: int = HEARTBEAT_MS,
    chaos: Chaos | None = None,
    hosts: Hosts | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` on ``replicas`` elastic replicas; the summary of the lowest-numbered replica
    that finished, with ``summary["elastic"]`` saying what happened to each.

    ``min_replicas`` (default: ``replicas``, at least 1) is torchft's: no averaging counts with
    fewer live replicas, and fewer finished replicas is a failed run (:class:`ElasticRunFailed`).
    ``folder`` keeps the replicas' logs (``replica{N}.err``), step records (``steps.jsonl``)
    and summaries; by default a temporary folder, removed. ``say`` gets one line per event.
    ``heartbeat_ms`` is the Lighthouse's ``heartbeat_timeout_ms``: after a replica is lost, the
    others wait about this long at their next quorum (0.52 s at 500, 2.07 s at 2000 in
    ``tests/elastic/test_chaos.py``); a live replica whose heartbeats (every 100 ms) are late
    by more is left out of a quorum and healed. ``chaos`` kills replicas on a schedule
    (:class:`Chaos`). ``hosts`` says where each process runs (:class:`Hosts`; default this
    machine).
    """
    min_replicas = replicas if min_replicas is None else min_replicas
    if not 1 <= min_replicas <= replicas:
        raise UsageError(f"min_replicas={min_replicas} must be between 1 and replicas={replicas}")
    if restart_delay_s < 0:
        raise UsageError(f"restart_delay_s={restart_delay_s} must be >= 0 seconds")
    budget = timeout_s or max(600.0, cfg.timeout_s * 4)
    settings = (
        cfg,
        replicas,
        min_replicas,
        restart_delay_s,
        lighthouse,
        budget,
        heartbeat_ms,
        chaos,
        hosts or Hosts(),
    )
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="dssync-elastic-") as tmp:
            return _run(*settings, Path(tmp), say)
    Path(folder).mkdir(parents=True, exist_ok=True)
    return _run(*settings, Path(folder), say)


def _run(
    cfg: TrainConfig,
    replicas: int,
    min_replicas: int,
    restart_delay_s: float,
    address: str | None,
    budget: float,
    heartbeat_ms: int,
    chaos: Chaos | None,
    hosts: Hosts,
    folder: Path,
    say: Callable[[str], None],
) -> dict[str, Any]:
    from dssync.lab.launch import core_share

    spec = {
        "config": cfg.to_dict(),
        "replicas": replicas,
        "min_replicas": min_replicas,
        "threads": core_share(replicas),
        "quorum_timeout_s": max(cfg.timeout_s, 60.0),
    }
    (folder / "config.json").write_text(json.dumps(spec))
    _STEPPED.pop(folder / "steps.jsonl", None)
    house = None
    if address is None:
        # the first quorum waits for every replica (they start together, see ``go``)
        house = Lighthouse(
            folder, min_replicas, int(READY_WAIT_S * 1000), heartbeat_ms, hosts=hosts
        )
        address = house.address
        say(f"lighthouse at {address} (min_replicas {min_replicas})")
    team = [Replica(n, host=hosts.of(n)) for n in range(replicas)]
    deadline = time.monotonic() + budget
    try:
        for r in team:
            _start(r, folder, address, say, hosts)
        _wait_ready(team, folder, deadline)
        (folder / "go").touch()
        _supervise(
            team, folder, address, restart_delay_s, deadline, say, chaos, min_replicas, hosts
        )
    finally:
        with _shielded():  # a second Ctrl-C or SIGTERM must not cut the killing short
            for r in team:
                _kill(r)
            if house is not None:
                house.close()
    finished = [r.number for r in team if r.ends and r.ends[-1] == "finished"]
    summaries = {n: json.loads((folder / f"summary{n}.json").read_text()) for n in finished}
    report = {
        "replicas": replicas,
        "min_replicas": min_replicas,
        "restart_delay_s": restart_delay_s,
        "finished": finished,
        "restarts": {str(r.number): r.starts - 1 for r in team},
        "ends": {str(r.number): r.ends for r in team},
        "final_model_sha256": {str(n): s["final_model_sha256"][0] for n, s in summaries.items()},
        "final_metric": {str(n): s["final_metric"] for n, s in summaries.items()},
        "chaos_kills": [] if chaos is None else chaos.kills,
    }
    if len(finished) < min_replicas:
        ends = "; ".join(f"replica {r.number}: {', '.join(r.ends) or 'never ended'}" for r in team)
        for r in team:
            if r.number not in finished and not r.told:
                say(_tail(folder / f"replica{r.number}.err"))
        raise ElasticRunFailed(
            f"{len(finished)} of {replicas} replicas finished, fewer than min_replicas="
            f"{min_replicas} ({ends}); their logs' tails are above"
        )
    first = summaries[min(finished)]
    return {**first, "elastic": report}


def _start(
    r: Replica, folder: Path, address: str, say: Callable[[str], None], hosts: Hosts | None = None
) -> None:
    hosts = hosts or Hosts()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **hosts.env[r.host]}
    env[HOST_ENV] = hosts.address[r.host]
    src = str(Path(__file__).resolve().parents[3])  # the replicas import this very dssync
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    name = f"replica{r.number}"
    r.proc = subprocess.Popen(
        [
            *hosts.prefix[r.host],
            sys.executable,
            "-m",
            "dssync.lab.elastic.replica",
            str(folder),
            str(r.number),
            address,
        ],
        stdout=open(folder / f"{name}.out", "a"),  # noqa: SIM115 - the child keeps it
        stderr=open(folder / f"{name}.err", "a"),  # noqa: SIM115
        env=env,
        start_new_session=True,
    )
    r.starts += 1
    r.restart_at = None
    word = "started" if r.starts == 1 else f"restarted (start {r.starts})"
    say(f"replica {r.number} {word}, pid {r.proc.pid}")


def _wait_ready(team: list[Replica], folder: Path, deadline: float) -> None:
    """Until every replica has loaded its data (``ready{N}``): the first quorum holds them all."""
    end = min(deadline, time.monotonic() + READY_WAIT_S)
    while not all((folder / f"ready{r.number}").exists() for r in team):
        for r in team:
            if r.proc is not None and r.proc.poll() is not None:
                print(_tail(folder / f"replica{r.number}.err"), file=sys.stderr)
                raise ElasticRunFailed(
                    f"replica {r.number} ended ({_how(r.proc.returncode)}) before it started "
                    "training; its log's tail is above"
                )
        if time.monotonic() > end:
            raise TimeoutError(f"the replicas did not load their data within {READY_WAIT_S:.0f} s")
        time.sleep(0.1)


def _supervise(
    team: list[Replica],
    folder: Path,
    address: str,
    restart_delay_s: float,
    deadline: float,
    say: Callable[[str], None],
    chaos: Chaos | None = None,
    min_replicas: int = 1,
    hosts: Hosts | None = None,
) -> None:
    """Watch until no replica runs and none waits for its restart; restart the lost ones."""
    while True:
        now = time.monotonic()
        if chaos is not None:
            _punish(team, folder, chaos, min_replicas, now, say)
        for r in team:
            if r.proc is not None and r.proc.poll() is not None:
                code = r.proc.returncode
                r.proc_pid, r.proc = r.proc.pid, None
                ending = any(x.ends and x.ends[-1] == "finished" for x in team)
                if code == 0:
                    r.ends.append("finished")
                    say(f"replica {r.number} finished")
                    continue
                pid = r.proc_pid
                r.ends.append(_how(code))
                if not _stepped(folder, pid):
                    r.told = True
                    say(
                        f"replica {r.number} failed before its first step ({_how(code)}): not "
                        f"restarted, a new process would fail the same way\n"
                        f"{_tail(folder / f'replica{r.number}.err')}"
                    )
                elif ending:
                    say(f"replica {r.number} lost ({_how(code)}) as the run ends: not restarted")
                else:
                    r.restart_at = now + restart_delay_s
                    say(
                        f"replica {r.number} lost ({_how(code)}); restarting in {restart_delay_s:g} s"
                    )
            if r.restart_at is not None and now >= r.restart_at:
                if any(x.ends and x.ends[-1] == "finished" for x in team):
                    r.restart_at = None  # the run ended while it waited
                else:
                    _start(r, folder, address, say, hosts)
        _dismiss_latecomers(team, folder, say)
        if all(r.proc is None and r.restart_at is None for r in team):
            return
        if now > deadline:
            raise TimeoutError(
                "the elastic run did not end in time; every replica was killed (raise --timeout "
                "or lower --epochs/--max-steps)"
            )
        time.sleep(0.1)


def _dismiss_latecomers(team: list[Replica], folder: Path, say: Callable[[str], None]) -> None:
    """Kill a restarted replica that has not stepped once another finished: the others are gone,
    its quorum would never form and it would wait out its quorum timeout before failing."""
    if not any(r.ends and r.ends[-1] == "finished" for r in team):
        return
    for r in team:
        if r.proc is None or r.starts < 2 or _stepped(folder, r.proc.pid):
            continue
        _kill(r)
        r.proc_pid, r.proc = r.proc.pid, None
        r.ends.append("dismissed: the run ended before it stepped")
        say(f"replica {r.number} dismissed: the run ended before its restart stepped")


def _punish(
    team: list[Replica],
    folder: Path,
    chaos: Chaos,
    min_replicas: int,
    now: float,
    say: Callable[[str], None],
) -> None:
    """SIGKILL a random running replica when ``chaos`` says it is time (see :class:`Chaos`)."""
    if any(r.ends and r.ends[-1] == "finished" for r in team):
        return  # the run is ending
    running = [r for r in team if r.proc is not None and r.proc.poll() is None]
    if chaos.next_at is None:  # the clock starts once every replica has stepped
        if len(running) == len(team) and all(_stepped(folder, r.proc.pid) for r in running):
            chaos.next_at = now + chaos.gap()
        return
    if now < chaos.next_at or len(running) <= min_replicas:
        return  # not yet, or a kill now would leave fewer than min_replicas running
    stepped = [r for r in running if _stepped(folder, r.proc.pid)]
    if not stepped:
        return  # a process killed before its first step would not be restarted
    victim = chaos.rng.choice(stepped)
    pid = victim.proc.pid
    os.killpg(pid, signal.SIGKILL)
    chaos.kills.append({"replica": victim.number, "pid": pid, "time": time.time()})
    chaos.next_at = now + chaos.gap()
    say(
        f"chaos: killed replica {victim.number} (pid {pid}); next kill in {chaos.next_at - now:.0f} s"
    )


def step_records(folder: Path) -> list[dict[str, Any]]:
    """The replicas' records in ``folder/steps.jsonl`` so far, in the order written (none before
    the file exists; a line still being written is left for the next read)."""
    path = folder / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


# steps.jsonl per folder: (bytes read, pids that recorded a step). The supervisor asks every
# 0.1 s and the file grows to megabytes; each question reads only what was added since. A run
# forgets its folder's entry when it starts.
_STEPPED: dict[Path, tuple[int, set[int]]] = {}


def _stepped(folder: Path, pid: int) -> bool:
    """Whether process ``pid`` recorded a step in ``folder/steps.jsonl``."""
    path = folder / "steps.jsonl"
    if not path.exists():
        return False
    read, pids = _STEPPED.get(path, (0, set()))
    if path.stat().st_size < read:  # a shorter file in its place
        read, pids = 0, set()
    with path.open("rb") as f:
        f.seek(read)
        added = f.read()
    whole = added[: added.rfind(b"\n") + 1]  # a line being written waits for the next question
    for line in whole.splitlines():
        if line.startswith(b'{"pid": ') and b'"step"' in line:
            pids.add(int(line[8 : line.index(b",")]))
    _STEPPED[path] = (read + len(whole), pids)
    return pid in pids


def _how(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


@contextmanager
def _shielded() -> Iterator[None]:
    """SIGINT and SIGTERM held off while the body runs (in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def _kill(r: Replica) -> None:
    if r.proc is None:
        return
    try:
        os.killpg(r.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    r.proc.wait(10)


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text() if path.exists() else ""
    keep = [x for x in text.splitlines() if "heartbeat" not in x.lower()]
    return f"--- {path.name}\n" + "\n".join(keep[-lines:])
