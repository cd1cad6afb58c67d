"""``--sync auto``: the method the planner predicts fastest to the target on the cluster the job sees.

From the detected topology with a short link probe's rates, the model's size and the compute
time (timed on a few passes before training), :func:`choose` runs the planner's cost model
(:func:`dssync.lab.plan.cost.predict`) for each method it models and picks the fastest iteration.
The local-step presets (``diloco``, ``dssync-topo-local``: an average every 4th step) are
predicted as compute plus a quarter of their every-step averaging. When one of them is picked,
it averages every :func:`local_every` steps: the fewest of 4, 8 and 16 that keep its averaging
per step within :data:`SYNC_SHARE` of the compute (16 when none does; the time-to-train tables
measure up to 16). Past that share, averaging less often saves little time and risks quality.

On racks of equal hosts (two racks or more, no host probed slower than :data:`PROBE_NOISE`
allows), a topology-aware local-step pick averages in groups of a whole rack
(:func:`rack_groups`), not in pairs: the rack's members then agree exactly at each average and
only what crosses the uplink mixes slowly. On S2 this reached mnist's target in 72
steps on every seed against 72-108 in pairs, 2.2 s against 3.0 s for DiLoCo on int8 in one race
(docs/time-to-train.md, "Settings tuned alike"). The iteration-time model does not see that
gain (it is in the steps, not the step), so it is a rule taken from measurement. With a slow host
the pairs stay: a group of four would wait for it at every average. A whole-rack group leaves
no pair beside a rack's crossing rank, so such a plan does not spread its crossings: a pair of
racks swaps the whole model every few averagings instead of a slice at each (what the S2 and
S4 races of whole-rack groups ran).

A topology-aware local-step pick in whole-rack groups sends int8 (:data:`RACK_WIRE`, with error
feedback: :mod:`dssync.comm.wire`) where the probed uplink runs under :data:`UPLINK_SHARE` of a
host's rate (:func:`slow_uplink`), unless ``--wire`` says otherwise. On S2 (a 200 Mbit/s uplink
under 1 Gbit/s hosts), five seeds each in one race, it reached mnist's target in 1.8 s (1.7-1.9)
against 2.2 s (2.0-2.3) in fp32, in the same steps, and again 1.8 s against 2.2 s in a second
race. On S4, whose uplink probes at the hosts' rate until contention comes, int8 took
2.3 s (1.8-2.6) against 2.2 s (2.0-3.1) and more steps (81 against 72), so there the pick stays
fp32 (docs/history.md, ninth session). In pairs (a slow host) int8 measured no faster (2.8 s
against 2.7 s on S3), nor with int8's faster decoder and streamed pairs (2.6 s (2.0-2.9)
against 2.4 s (2.0-3.3); docs/history.md, tenth session), so pairs keep fp32.

A local-step pick applies DiLoCo's outer step (SGD with Nesterov momentum on the averaged
pseudo-gradient) unless ``--outer`` says otherwise: at one average every 16 steps it cut the steps
to mnist's target on both bottlenecked scenarios, for DS-Sync's groups and for the global average
alike (docs/time-to-train.md). After an Adam-family optimizer's steps it applies none
(:data:`OUTER` is ``"auto"``): on the language model ``lm`` with AdamW the outer step lost 16.4%
validation loss at every=16 and 44.5% at every=4, against 3.1% and 6.9% without one
(docs/guide/adam.md). The local-SGD candidate is therefore ``diloco``.

After an Adam-family optimizer's steps (``adaptive=True``) auto averages every step, in the
optimizer's step (``average_grads``): it leaves out the local-step presets unless ``--every``
is given, and overlap, which merges after the step. On ``lm`` at 8 workers on S2 the local-step
pick (topology-aware groups of a whole rack averaging every 4 steps in int8, no outer step)
reached the validation target on no seed of three in 320 steps, nor did DiLoCo or local SGD,
where BSP and DS-Sync's pairs every step reached it on every seed (docs/time-to-train.md, "The
language model"); at equal steps local steps with AdamW lost 3-7% (docs/guide/adam.md).

The rule assumes the candidates need about as many steps to the target as BSP does; the
time-to-train tables (docs/time-to-train.md) check it on each shipped scenario, local steps
included. A user whose model needs an average every step passes ``--every 1``, which the chosen
preset then takes. Overlap is taken only when it is predicted at most :data:`OVERLAP_GAIN` of the
best blocking plan, because it merges each average one step late. Probed host rates within
:data:`PROBE_NOISE` of the fastest are taken as equal: a short probe on equal links reads
700-1100 Mbit/s on 1 Gbit/s links, and a plan made from that noise treats equal hosts as slow.

Example::

    >>> from dssync.lab.cluster import load_cluster
    >>> c = choose(load_cluster("s2-inter-rack").topology(), params=1_600_000, compute_s=0.02)
    >>> c.method
    'dssync-topo-local'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dssync.lab.cluster.spec import ClusterSpec
from dssync.lab.plan.cost import Prediction, predict
from dssync.topology import Topology

# The planner's names for the methods it models -> the method each one runs.
CANDIDATES = {
    "ddp": "bsp",
    "hierarchical": "hierarchical",
    "dssync": "dssync",
    "dssync-topo": "dssync-topo",
    "dssync-topo overlapped": "dssync-topo-overlap",
    "diloco": "diloco",
    "dssync-topo local": "dssync-topo-local",
}
# The local-step candidates: (name, the every-step plan whose averaging they thin out, method,
# its preset's every=; a test checks these against the method table).
LOCAL = (
    ("diloco", "ddp", "diloco", 4),
    ("dssync-topo local", "dssync-topo", "dssync-topo-local", 4),
)
OVERLAP_GAIN = 0.8
PROBE_NOISE = 0.4
# A local-step pick averages every EVERY_CHOICES[i] steps: the first whose averaging per step is
# at most SYNC_SHARE of the compute, else the last.
EVERY_CHOICES = (4, 8, 16)
SYNC_SHARE = 0.25
OUTER = "auto"  # a local-step pick's outer step unless --outer is given: nesterov, none after Adam
RACK_WIRE = "int8"  # what a whole-rack pick sends over a slow uplink, unless --wire is given
UPLINK_SHARE = 0.5  # an uplink below this share of a host's rate is slow


@dataclass(frozen=True)
class Choice:
    """The method picked, the one line that says why, and every prediction it compared;
    ``every``: how often a local-step pick averages (None: the method's own); ``outer``: the
    outer step it applies, ``group_size`` its groups' size and ``wire`` what it sends (None:
    the method's own)."""

    method: str
    reason: str
    predictions: tuple[Prediction, ...]
    every: int | None = None
    outer: str | None = None
    group_size: int | None = None
    wire: str | None = None
    predicted_s: float | None = None  # the pick's predicted iteration, in seconds


def rack_groups(spec: ClusterSpec) -> int | None:
    """Ranks per group for a topology-aware local-step pick on ``spec``: a whole rack when there
    are two racks or more, every host at the same rate and more than two ranks to a rack; None
    (the preset's pairs) otherwise.

    Example::

        >>> from dssync.lab.cluster import load_cluster
        >>> rack_groups(load_cluster("s2-inter-rack")), rack_groups(load_cluster("s3-slow-host"))
        (4, None)
    """
    rack = spec.hosts_per_rack * spec.workers_per_host
    if spec.racks < 2 or spec.host_overrides or rack <= 2:
        return None
    return rack


def slow_uplink(spec: ClusterSpec) -> bool:
    """Whether the racks' uplink runs under :data:`UPLINK_SHARE` of a host's rate (as probed).

    Example::

        >>> from dssync.lab.cluster import load_cluster
        >>> slow_uplink(load_cluster("s2-inter-rack")), slow_uplink(load_cluster("s1-homogeneous"))
        (True, False)
    """
    up = spec.rack_uplink_mbit
    return up is not None and up < UPLINK_SHARE * spec.host_rate_mbit


def local_every(averaging_s: float, compute_s: float) -> int | None:
    """Steps between averagings for a local-step method whose one averaging takes
    ``averaging_s``: the fewest of :data:`EVERY_CHOICES` keeping it within :data:`SYNC_SHARE` of
    ``compute_s`` per step, else the most; None when the compute is unknown (0).

    Example::

        >>> local_every(0.056, 0.018)  # S2's topology-aware averaging against mnist's step
        16
    """
    if compute_s <= 0:
        return None
    fits = [e for e in EVERY_CHOICES if averaging_s / e <= SYNC_SHARE * compute_s]
    return fits[0] if fits else EVERY_CHOICES[-1]


def canonical(topology: Topology) -> tuple[ClusterSpec, Topology] | None:
    """A cluster spec of the same shape and rates as ``topology`` (ranks renumbered rack by rack,
    host by host) and that spec's own topology; None when racks or hosts differ in size."""
    hosts = sorted(set(topology.hosts), key=lambda h: (topology.racks[topology.hosts.index(h)], h))
    racks = sorted(set(topology.racks))
    per_host = {len(topology.ranks_on_host(h)) for h in hosts}
    per_rack = {len({topology.hosts[r] for r in topology.ranks_in_rack(k)}) for k in racks}
    if len(per_host) != 1 or len(per_rack) != 1:
        return None
    known = [topology.host_mbit[h] for h in hosts if h in topology.host_mbit]
    base = max(known) if known else 1000.0
    overrides = {
        i: topology.host_mbit[h]
        for i, h in enumerate(hosts)
        if h in topology.host_mbit and topology.host_mbit[h] < (1 - PROBE_NOISE) * base
    }
    spec = ClusterSpec(
        "detected",
        racks=len(racks),
        hosts_per_rack=per_rack.pop(),
        workers_per_host=per_host.pop(),
        host_rate_mbit=base,
        rack_uplink_mbit=topology.uplink_mbit if len(racks) > 1 else None,
        host_overrides=overrides,
    )
    return spec, spec.topology()


def choose(
    topology: Topology,
    params: int,
    compute_s: float,
    repeat: int = 8,
    local: bool = True,
    every: int | None = None,
    outer: str | None = None,
    group_size: int | None = None,
    wire: str | None = None,
    spell: Callable[[str], str] | None = None,
    adaptive: bool = False,
) -> Choice:
    """The method predicted fastest for a model of ``params`` float32 parameters whose step
    computes in ``compute_s`` on ``topology`` (rates as probed; unknown rates are taken as
    1 Gbit/s hosts and an unshaped core); ``local=False`` leaves out the local-step presets, and
    ``every`` (``--every``) fixes how often a local-step pick averages, ``outer``
    (``--outer``) what it applies (default :data:`OUTER`), ``group_size`` (``--group-size``)
    its groups' size (default: :func:`rack_groups`) and ``wire`` (``--wire``) what a whole-rack
    pick sends (default :data:`RACK_WIRE`). ``spell(option)`` is how the reason names an option
    that was given (default: the CLI's flag, ``--every``; :func:`dssync.lab.auto` passes
    ``every=``). ``adaptive``: the optimizer is Adam-family, which leaves out overlap and, unless
    ``every`` is given, the local-step presets (module docstring)."""
    spell = spell or flag
    fixed = every
    adam = adaptive and fixed is None  # local steps left out: the reason says why
    local = local and not adam
    shaped = canonical(topology)
    if shaped is None:
        return Choice(
            "dssync-topo",
            "hosts or racks differ in size, which the cost model does not cover; "
            "topology-aware DS-Sync keeps groups inside racks whatever their size",
            (),
        )
    spec, known = shaped
    every = predict(spec, params, compute_s, repeat, known=known)
    by = {p.method: p for p in every}
    for name, plan, _, every in LOCAL if local else ():
        sync = by[plan].sync_s / every
        by[name] = Prediction(name, sync, compute_s + sync)
    preds = tuple(p for p in by.values() if p.method in CANDIDATES)
    blocking = min((p for p in preds if "overlapped" not in p.method), key=lambda p: p.iter_s)
    best = blocking
    over = None if adaptive else by.get("dssync-topo overlapped")
    if over is not None and over.iter_s <= OVERLAP_GAIN * blocking.iter_s:
        best = over
    ddp = by["ddp"]
    method = CANDIDATES[best.method]
    how = " behind the compute" if best is over else ""
    thinned = {name: (plan, every) for name, plan, _, every in LOCAL}
    chosen = step = size = sent = None
    if best.method in thinned:
        step = outer or OUTER
        plan, every = thinned[best.method]
        chosen = fixed if fixed is not None else local_every(by[plan].sync_s, compute_s)
        if chosen is not None and chosen != every:
            sync = by[plan].sync_s / chosen
            best = Prediction(best.method, sync, compute_s + sync)
            why = (
                f"as {spell('every')} says"
                if fixed is not None
                else f"the fewest of {'/'.join(map(str, EVERY_CHOICES))} within "
                f"{SYNC_SHARE:.0%} of the compute"
            )
            how = f" per iteration, one average every {chosen} steps: {why}"
        else:
            how = f" per iteration, one average every {every} steps"
        if step == "auto":
            how += ", DiLoCo's outer Nesterov step at each average (none after Adam-family steps)"
        elif step != "none":
            how += ", DiLoCo's outer Nesterov step at each average" + (
                f" (as {spell('outer')} says)" if outer else ""
            )
        if method == "dssync-topo-local":
            size = group_size if group_size is not None else rack_groups(spec)
            if group_size is not None:
                how += f", groups of {group_size} (as {spell('group_size')} says)"
            elif size is not None:
                how += f", groups of a whole rack ({size}: its hosts are equal)"
            if (
                size is not None
                and size == rack_groups(spec)
                and wire is None
                and slow_uplink(spec)
            ):
                sent = RACK_WIRE
                how += (
                    f", sent in {sent} (the uplink is under {UPLINK_SHARE:.0%} of a host's rate; "
                    "the prediction is for fp32)"
                )
    if adaptive:
        how += (
            "; after Adam-family steps: "
            + ("no local steps, " if adam else "")
            + "no overlap (the average lands in the optimizer's step)"
        )
    reason = (
        f"{method}: predicted {_ms(best.iter_s)} per iteration "
        f"({_ms(best.sync_s)} of averaging{how}) "
        f"against BSP's {_ms(ddp.iter_s)}, for {_count(params)} parameters, "
        f"{_ms(compute_s)} of compute, {_links(topology)}"
    )
    return Choice(method, reason, preds, chosen, step, size, sent, best.iter_s)


def flag(option: str) -> str:
    """The CLI's flag for ``option``: ``group_size`` -> ``--group-size``."""
    return "--" + option.replace("_", "-")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 0.01 else f"{seconds * 1000:.0f} ms"


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def _links(t: Topology) -> str:
    rates = sorted(set(t.host_mbit.values()))
    hosts = (
        "hosts at " + "/".join(f"{r:.0f}" for r in rates) + " Mbit/s"
        if rates
        else "host rates unknown"
    )
    up = f", {t.num_racks} racks joined at {t.uplink_mbit:.0f} Mbit/s" if t.uplink_mbit else ""
    return f"{t.num_hosts} hosts, {hosts}{up}"
