"""Build and tear down an emulated cluster from network namespaces, veth pairs and bridges.

Where each piece lives is :mod:`dssync.lab.cluster.names`; starting a torchrun agent per host in it
is :mod:`dssync.lab.cluster.workers`; its byte counters are :mod:`dssync.lab.cluster.accounting`.

Host names resolve as on a real network: ``ip netns exec`` mounts ``/etc/netns/<ns>/hosts`` over
``/etc/hosts``, and each host namespace gets one naming every host (``<prefix>-h<i>``).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import threading
from pathlib import Path
from types import FrameType

from dssync.lab.cluster import shaping
from dssync.lab.cluster.accounting import LinkBytes, LossCounters, link_bytes, losses
from dssync.lab.cluster.names import ANY_PREFIX_RE, ETC_NETNS, SUBNET, ClusterNames, check_prefix
from dssync.lab.cluster.shell import ClusterError, require_root_and_tools, sh
from dssync.lab.cluster.spec import ClusterSpec
from dssync.lab.cluster.workers import Agents, RunResult, kill_namespace, start_agents


class Cluster(ClusterNames):
    """An emulated cluster: one namespace per host, shaped links, bridges in a switch namespace.

    Example::

        spec = load_cluster("tiny")
        with Cluster(spec) as cluster:           # builds it; tears it down on exit or SIGTERM
            cluster.set_rate("rack_uplink", 100)
            result = cluster.run([sys.executable, "train.py"], timeout_s=60)
            print(result.summary())
    """

    def __init__(self, spec: ClusterSpec, prefix: str | None = None) -> None:
        super().__init__(spec, prefix)
        self.rates: dict[str, float | None] = spec.link_rates()
        self._old_sigterm: object = None

    # build / teardown --------------------------------------------------------------------
    def up(self) -> Cluster:
        """Create namespaces, bridges and shaped links. On any failure, remove what was built."""
        require_root_and_tools()
        existing = sh(["ip", "netns", "list"], check=False)
        if re.search(rf"^{self.prefix}-", existing, re.MULTILINE):
            raise ClusterError(
                f"a cluster with prefix {self.prefix} already exists; "
                f"run `dssync cluster down {self.prefix}` or pick another prefix"
            )
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        p, spec, sw = self.prefix, self.spec, self.switch_ns
        namespaces = [sw] + [self.host_ns(h) for h in range(spec.num_hosts)]
        for ns in namespaces:
            sh(["ip", "netns", "add", ns])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            sh(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "sh",
                    "-c",
                    "for f in /proc/sys/net/ipv6/conf/*/disable_ipv6; do echo 1 > $f; done",
                ],
                check=False,
            )
        bridges = [f"{p}r{r}" for r in range(spec.racks)] + ([f"{p}core"] if spec.has_core else [])
        for br in bridges:
            sh(["ip", "-n", sw, "link", "add", br, "type", "bridge"])
            sh(["ip", "-n", sw, "link", "set", br, "up"])
        for h in range(spec.num_hosts):
            ns, dev, peer = self.host_ns(h), self.host_ifname(h), f"{p}h{h}s"
            sh(
                [
                    "ip",
                    "link",
                    "add",
                    dev,
                    "netns",
                    ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    peer,
                    "netns",
                    sw,
                ]
            )
            sh(["ip", "-n", sw, "link", "set", peer, "master", f"{p}r{spec.rack_of_host(h)}"])
            sh(["ip", "-n", sw, "link", "set", peer, "up"])
            sh(
                [
                    "ip",
                    "-n",
                    ns,
                    "addr",
                    "add",
                    f"{self.address_of(h)}/{SUBNET.prefixlen}",
                    "dev",
                    dev,
                ]
            )
            sh(["ip", "-n", ns, "link", "set", dev, "up"])
        if spec.has_core:
            for r in range(spec.racks):
                end, core_end = f"{p}u{r}", f"{p}u{r}c"
                sh(["ip", "-n", sw, "link", "add", end, "type", "veth", "peer", "name", core_end])
                sh(["ip", "-n", sw, "link", "set", end, "master", f"{p}r{r}"])
                sh(["ip", "-n", sw, "link", "set", core_end, "master", f"{p}core"])
                sh(["ip", "-n", sw, "link", "set", end, "up"])
                sh(["ip", "-n", sw, "link", "set", core_end, "up"])
        for link, rate in self.rates.items():
            if rate is not None:
                for ns, dev in self.link_ends(link):
                    shaping.set_tbf(ns, dev, rate)
        self._write_hosts_files()

    def _write_hosts_files(self) -> None:
        """``/etc/netns/<ns>/hosts`` for every host namespace: every host's name and address."""
        lines = ["127.0.0.1 localhost"]
        lines += [f"{self.address_of(h)} {self.host_ns(h)}" for h in range(self.spec.num_hosts)]
        for h in range(self.spec.num_hosts):
            folder = ETC_NETNS / self.host_ns(h)
            try:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "hosts").write_text("\n".join(lines) + "\n")
            except OSError as exc:
                raise ClusterError(
                    f"cannot write {folder / 'hosts'} ({exc.strerror}); the emulated hosts "
                    f"need their names there: make {ETC_NETNS} writable for root"
                ) from None

    def down(self) -> None:
        """Remove every namespace, link and qdisc of this cluster. Safe to call twice."""
        remove_prefix(self.prefix)

    def set_rate(self, link: str, rate_mbit: float | None) -> None:
        """Change ``link`` (``rack_uplink``, ``rack_uplink:1``, ``host:3``, ``host``) live.

        Both ends get the new tbf rate; ``None`` removes the limit.
        """
        if rate_mbit is not None and not rate_mbit > 0:
            raise ClusterError(f"rate {rate_mbit!r} Mbit/s must be > 0; use None for unshaped")
        for name in self.spec.expand_link(link):
            for ns, dev in self.link_ends(name):
                shaping.set_tbf(ns, dev, rate_mbit)
            self.rates[name] = rate_mbit

    # context manager: clean up on exceptions, Ctrl-C and SIGTERM ---------------------------
    def __enter__(self) -> Cluster:
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
        return self.up()

    def __exit__(self, *exc: object) -> None:
        main = threading.current_thread() is threading.main_thread()
        if main:  # do not let a second Ctrl-C or SIGTERM cut the teardown short
            old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            self.down()
        finally:
            if main:
                signal.signal(signal.SIGINT, old_int)
                signal.signal(signal.SIGTERM, self._old_sigterm or signal.SIG_DFL)
                self._old_sigterm = None

    # state file, so `dssync cluster list` can name what a cluster was built from -----------
    def save_state(self) -> Path:
        """Record prefix and cluster spec source under /tmp/dssync-clusters."""
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        path = STATE_DIR / f"{self.prefix}.json"
        path.write_text(json.dumps({"prefix": self.prefix, "source": self.spec.source}))
        return path

    # workers and accounting live in their own modules ---------------------------------------
    def launch(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
        join_timeout_s: float = 600.0,
        max_restarts: int = 0,
    ) -> Agents:
        """Start one torchrun agent per host running ``argv`` on each of its workers; see
        ``workers.start_agents`` (``max_restarts`` is torchrun's ``--max-restarts``)."""
        return start_agents(
            self,
            argv,
            env=env,
            log_dir=log_dir,
            join_timeout_s=join_timeout_s,
            max_restarts=max_restarts,
        )

    def run(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout_s: float = 600.0,
        log_dir: Path | None = None,
    ) -> RunResult:
        """Launch ``argv`` on every worker (torchrun per host) and wait; a failure or timeout
        stops every host."""
        return self.launch(argv, env=env, log_dir=log_dir, join_timeout_s=timeout_s).wait(timeout_s)

    def link_bytes(self) -> dict[str, LinkBytes]:
        """Byte counters of every link now; subtract two snapshots with ``accounting.diff``."""
        return link_bytes(self)

    def losses(self) -> LossCounters:
        """tbf drops per link and the hosts' TCP retransmissions now; subtract two snapshots."""
        return losses(self)


STATE_DIR = Path("/tmp/dssync-clusters")


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def list_prefixes() -> list[str]:
    """Prefixes of all dssync clusters that have namespaces on this machine."""
    out = sh(["ip", "netns", "list"], check=False)
    found = {
        m.group(1) for line in out.splitlines() if (m := ANY_PREFIX_RE.match(line.split(" ")[0]))
    }
    found |= {p.stem for p in STATE_DIR.glob("dss*.json")} if STATE_DIR.is_dir() else set()
    if ETC_NETNS.is_dir():  # a hosts file left by a cluster whose namespaces are gone
        found |= {m.group(1) for f in ETC_NETNS.iterdir() if (m := ANY_PREFIX_RE.match(f.name))}
    return sorted(found)


def remove_prefix(prefix: str) -> list[str]:
    """Kill processes in, and delete, every namespace named ``<prefix>-...`` and its
    ``/etc/netns`` folder; return the namespaces' names.

    Deleting a namespace deletes its interfaces, their veth peers and their qdiscs.
    """
    check_prefix(prefix)
    require_root_and_tools()
    out = sh(["ip", "netns", "list"], check=False)
    names = [line.split(" ")[0] for line in out.splitlines()]
    ours = [n for n in names if (m := ANY_PREFIX_RE.match(n)) and m.group(1) == prefix]
    for ns in ours:
        kill_namespace(ns)
    for ns in ours:
        sh(["ip", "netns", "del", ns], check=False)
    if ETC_NETNS.is_dir():
        for folder in ETC_NETNS.glob(f"{prefix}-*"):
            if ANY_PREFIX_RE.match(folder.name):
                shutil.rmtree(folder, ignore_errors=True)
    # Defensive: nothing is created in the root namespace, but remove any stray link of ours.
    root_links = json.loads(sh(["ip", "-j", "link", "show"], check=False) or "[]")
    pattern = re.compile(rf"^{prefix}(h\d+s?|r\d+|u\d+c?|core)$")
    for link in root_links:
        if pattern.match(link.get("ifname", "")):
            sh(["ip", "link", "del", link["ifname"]], check=False)
    (STATE_DIR / f"{prefix}.json").unlink(missing_ok=True)
    return ours
