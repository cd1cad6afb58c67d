"""The torchrun command line each emulated host runs, and what its launcher line sets.

Every host namespace runs the multi-node command a user runs on each real machine::

    python -m torch.distributed.run --nnodes H --nproc-per-node R --rdzv-backend c10d \\
        --rdzv-endpoint <host 0's name>:<port> --rdzv-id <id> -m <module> ...

What a real machine has and a namespace lacks, the host's launcher line provides, as a cluster's
own launcher would: a host name of its own (a UTS namespace named like the host namespace, which
every namespace resolves through ``/etc/netns/<ns>/hosts``), ``GLOO_SOCKET_IFNAME`` (its one
interface) and ``DSSYNC_RACK`` (the rack, which no machine can see for itself). Every host also
shares one machine's cores, so each worker gets its share (``OMP_NUM_THREADS``, from
:func:`dssync.lab.launch.core_share`): this is the one place a worker on the cluster gets its threads.
"""

from __future__ import annotations

import os
import shutil
import sys

from dssync.lab.cluster.names import ClusterNames
from dssync.lab.cluster.shell import sh
from dssync.lab.launch import core_share

# Variables torchrun sets for each worker; one inherited from a parent launcher must not leak.
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "DSSYNC_HOST",
)


def free_port(cluster: ClusterNames, host: int = 0) -> int:
    """A TCP port that is free on ``host`` (asked inside its namespace)."""
    code = "import socket; s=socket.socket(); s.bind(('',0)); print(s.getsockname()[1])"
    out = sh(["ip", "netns", "exec", cluster.host_ns(host), sys.executable, "-c", code])
    return int(out.strip())


def entry_point(argv: list[str]) -> list[str]:
    """What follows torchrun's own flags: ``-m MOD ...``, ``SCRIPT ...`` or ``--no-python CMD ...``.

    ``[python, -m, mod, ...]`` and ``[python, script.py, ...]`` (this interpreter) become torchrun's
    ``-m mod ...`` and ``script.py ...``; any other command runs as it is (``--no-python``).
    """
    if len(argv) >= 2 and _is_this_python(argv[0]):
        if argv[1] == "-m" and len(argv) >= 3:
            return ["-m", *argv[2:]]
        if not argv[1].startswith("-"):
            return argv[1:]
    return ["--no-python", *argv]


def _is_this_python(arg: str) -> bool:
    found = shutil.which(arg) or arg
    return os.path.realpath(found) == os.path.realpath(sys.executable)


def torchrun_argv(
    cluster: ClusterNames,
    port: int,
    run_id: str,
    argv: list[str],
    join_timeout_s: float,
    max_restarts: int = 0,
) -> list[str]:
    """The torchrun command every host runs (the same on each, as in the README).

    ``max_restarts`` > 0 lets torchrun restart every host's workers after one fails, that many
    times (``--max-restarts``); the workers resume from their checkpoints if they were told to.
    """
    spec = cluster.spec
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(spec.num_hosts),
        "--nproc-per-node",
        str(spec.workers_per_host),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{cluster.host_ns(0)}:{port}",
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        f"join_timeout={max(int(join_timeout_s), 1)}",
        *(["--max-restarts", str(max_restarts)] if max_restarts else []),
        *entry_point(argv),
    ]


def host_env(cluster: ClusterNames, host: int) -> dict[str, str]:
    """What the launcher line of ``host`` exports (torchrun sets the rank variables)."""
    return {
        "GLOO_SOCKET_IFNAME": cluster.host_ifname(host),
        "DSSYNC_RACK": str(cluster.spec.rack_of_host(host)),
        "DSSYNC_CLUSTER": cluster.prefix,
        "OMP_NUM_THREADS": str(core_share(cluster.spec.world_size)),
        "PYTHONUNBUFFERED": "1",
    }


def host_command(cluster: ClusterNames, host: int, command: list[str]) -> list[str]:
    """``command`` inside ``host``'s network namespace, with the host name set in a UTS namespace."""
    ns = cluster.host_ns(host)
    rename = 'hostname "$0" && exec "$@"'
    return ["ip", "netns", "exec", ns, "unshare", "--uts", "--", "sh", "-c", rename, ns, *command]
