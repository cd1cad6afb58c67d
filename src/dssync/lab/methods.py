"""The synchronization methods every command offers, by name: the one table to add a method to.

Each entry says what the method is (one line, shown in ``--help``), how to build its strategy
from a :class:`~dssync.lab.config.TrainConfig`, a module and its optimizer, and what it needs from the
job beyond that (the topology; measured link rates). ``dssync train --sync``, ``dssync compare
--methods``, ``dssync bench --method`` and ``dssync bench-straggler --methods`` all read it.

Every DS-Sync method is a preset: a dict of the one :class:`~dssync.strategies.DSSync`'s options
(``{"plan": "topology", "replan": 8, "every": 4}``), kept as data in ``_TABLE``; a user's
``--every``, ``--outer``, ``--overlap`` and ``--replan`` override a preset's values, so a
combination needs no name. To add a DS-Sync variant, add one :func:`preset` line; to add another
method, write its strategy (one file in ``strategies/``), a builder here, and one
:class:`Method` line.

Example::

    from dssync.lab.methods import build_strategy, get_method

    get_method("ddp").name                                # "bsp" (an alias)
    get_method("diloco").options      # {"plan": "global", "every": 4, "outer": "auto"}
    strategy = build_strategy(cfg, model, optimizer)      # cfg.sync names the method
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dssync.comm.wire import WIRES
from dssync.errors import UsageError
from dssync.lab.baselines import BSP, DPSGD, FP16, Hierarchical, LocalSGD, PowerSGD, Solo
from dssync.lab.baselines.ps import ParameterServer
from dssync.lab.config import TrainConfig
from dssync.schedules import ExpGossip, Global, schedule_from_name
from dssync.schedules.topology import DEFAULT_MAX_EVERY, SPREAD, plan_topology_aware
from dssync.strategies import DSSync, Strategy
from dssync.strategies.before_step import is_adaptive
from dssync.strategies.options import Options
from dssync.strategies.outer import OuterFactory, nesterov
from dssync.strategies.waitless import AsyncDSSync
from dssync.topology import Topology

Builder = Callable[["TrainConfig", nn.Module, torch.optim.Optimizer, Topology | None], Strategy]

TOPOLOGY = "topology"  # which ranks share hosts and racks (detected when not given)
RATES = "rates"  # link rates too: the lab probes them at start-up (train/loop.py start_topology)
# One process per replica on torchft's elastic launcher (dssync.lab.elastic), not a fixed group
ELASTIC = "elastic"
# The options a preset sets and a user may override (TrainConfig fields, None: the preset's),
# with their value when neither does: dssync.Options's fields of the same names and defaults
# (``outer`` by name: "none", "nesterov" or "auto", :data:`OUTERS`).
DEFAULTS = Options()
OPTIONS: dict[str, Any] = {
    "every": DEFAULTS.every,
    "replan": DEFAULTS.replan,
    "overlap": DEFAULTS.overlap,
    "outer": "none",
    "wire": DEFAULTS.wire,
    "fragments": DEFAULTS.fragments,
}
# --outer: none, DiLoCo's SGD with Nesterov momentum, or "auto": nesterov after inner steps of the
# SGD family, none after the Adam family's (on lm, with AdamW, nesterov lost 16.4% validation loss
# at every=16 on 2 ranks and 44.5% at every=4 on 4, against 3.1% and 6.9% without: adam.md)
OUTERS = ("none", "nesterov", "auto")
GROUP_SIZE = 2  # ranks per DS-Sync group when --group-size is not given (auto may pick another)


@dataclass(frozen=True)
class Method:
    """One synchronization method: its name, a one-line description and its builder.

    ``settings`` are TrainConfig fields the method fixes (a variant of another method, such as
    DS-Sync on static groups); ``needs`` lists what the job must provide beyond the config.
    ``options`` are the preset's defaults of the :data:`OPTIONS` it ``takes`` (a user's
    ``--every``, ``--outer``, ``--overlap``, ``--replan`` override them) and, for a DS-Sync
    preset (:func:`preset`), how its groups are made.

    Example::

        Method("bsp", "DDP: all-reduce of gradients every step", _bsp, aliases=("ddp",))
    """

    name: str
    description: str
    build: Builder
    needs: frozenset[str] = frozenset()
    settings: dict[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    takes: frozenset[str] = frozenset()
    preset: bool = False  # a DS-Sync preset (:func:`preset`): one DSSync with ``options``

    @property
    def variant(self) -> bool:
        """True for a preset of another method (left out of ``all``)."""
        return bool(self.settings)


def _bucket_bytes(cfg: TrainConfig) -> int:
    return int(cfg.bucket_mb * 2**20)


def _outer(cfg: TrainConfig, opt: torch.optim.Optimizer) -> OuterFactory | None:
    """The outer step ``cfg.outer`` names; ``"auto"`` is none after an Adam-family optimizer."""
    if cfg.outer in (None, "none") or (cfg.outer == "auto" and is_adaptive(opt)):
        return None
    return nesterov(lr=cfg.outer_lr)


def _dssync(
    cfg: TrainConfig,
    module: nn.Module,
    opt: torch.optim.Optimizer,
    topology: Topology | None,
    pairs: str = "exchange",
    plan: str = "schedule",
    spread: bool = SPREAD,
    process_group: dist.ProcessGroup | None = None,
) -> Strategy:
    """The one DSSync with the options ``cfg`` holds (:func:`configure` filled in the preset's),
    over ``process_group`` (default: all ranks).

    ``plan`` says where the groups come from: ``"schedule"`` (``--schedule``), ``"topology"``
    (the topology-aware plan of the detected topology), ``"global"`` (everyone: DiLoCo) or
    ``"exp-gossip"``.
    """
    replan = cfg.replan or 0
    if plan == "topology":
        if topology is None:
            from dssync.topology import detect

            topology = detect()
        max_every = replan or DEFAULT_MAX_EVERY
        schedule = plan_topology_aware(
            topology, cfg.group_size, cfg.seed, max_every=max_every, spread=spread
        )
    elif plan == "global":
        schedule = Global()
    elif plan == "exp-gossip":
        schedule = ExpGossip()
    else:
        schedule = schedule_from_name(
            cfg.schedule, cfg.group_size, seed=cfg.seed, repeat=cfg.repeat
        )
    options = Options(
        schedule=schedule,
        replan=replan,
        overlap=bool(cfg.overlap),
        every=cfg.every or 1,
        outer=_outer(cfg, opt),
        bucket_bytes=_bucket_bytes(cfg),
        timeout_s=cfg.timeout_s,
        pairs=pairs,
        wire=cfg.wire or DEFAULTS.wire,
        fragments=cfg.fragments or 1,
    )
    return DSSync(
        module,
        # Adam's family always: averaged at its step (before_step); without, +7.2% loss on lm
        optimizer=opt if cfg.average_momentum or is_adaptive(opt) else None,
        process_group=process_group,
        options=options,
    )


def _bsp(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    return BSP(module, bucket_cap_mb=cfg.bucket_mb)


def _local_sgd(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    return LocalSGD(module, every=cfg.every or 1, bucket_bytes=_bucket_bytes(cfg))


def _solo(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    return Solo(module, bucket_bytes=_bucket_bytes(cfg))


def _hierarchical(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    return Hierarchical(module, topology, bucket_bytes=_bucket_bytes(cfg))


def _powersgd(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    return PowerSGD(module, rank=cfg.powersgd_rank, bucket_cap_mb=cfg.bucket_mb, seed=cfg.seed)


def _fp16(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    return FP16(module, bucket_cap_mb=cfg.bucket_mb)


def _dpsgd(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    return DPSGD(module, bucket_bytes=_bucket_bytes(cfg), timeout_s=cfg.timeout_s)


def _asp(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    return ParameterServer(module, opt, staleness=None, timeout_s=cfg.timeout_s)


def _ssp(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    return ParameterServer(module, opt, staleness=cfg.staleness, timeout_s=cfg.timeout_s)


def _dssync_async(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    return AsyncDSSync(module, seed=cfg.seed, timeout_s=cfg.timeout_s)


def _auto(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    """What the planner picks from the probed topology and the model's size alone; the training
    loop resolves ``auto`` before this with the compute time it measured (dssync.lab.train.auto)."""
    from dssync.lab.plan.auto import choose
    from dssync.topology import detect

    if topology is None or not topology.host_mbit:
        topology = detect(probe=True, timeout_s=cfg.timeout_s)
    params = sum(p.numel() for p in module.parameters())
    c = choose(
        topology,
        params,
        compute_s=0.0,
        repeat=cfg.replan or DEFAULT_MAX_EVERY,
        group_size=cfg.group_size,
        wire=cfg.wire,
        adaptive=is_adaptive(opt),
    )
    chosen = with_pick(cfg, c.method, c.every, c.outer, c.group_size, c.wire)
    return get_method(c.method).build(configure(chosen), module, opt, topology)


def _elastic(
    cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer, topology: Topology | None
) -> Strategy:
    """An elastic method has no strategy on a fixed group: its replicas run on torchft's
    launcher (:func:`dssync.lab.elastic.launch.run_elastic`), each building its own
    (:func:`dssync.lab.elastic.methods.build_trainer`)."""
    raise UsageError(
        f"{cfg.sync} runs one process per replica on torchft's elastic launcher, not on a fixed "
        f"group of ranks: run it with `dssync train --elastic --sync {cfg.sync}` or `dssync "
        "compare` on local processes"
    )


def _elastic_method(name: str, description: str, every: int) -> Method:
    return Method(
        name,
        description,
        _elastic,
        needs=frozenset({ELASTIC}),
        options={"every": every},
        takes=frozenset({"every"}),
    )


_TOPO = frozenset({TOPOLOGY})
_TOPO_RATES = frozenset({TOPOLOGY, RATES})
# How a DS-Sync preset's groups are made and exchanged: passed to the builder, not overridable.
_SHAPE = ("plan", "pairs", "spread")


def preset(
    name: str,
    description: str,
    options: dict[str, Any],
    settings: dict[str, Any] | None = None,
    aliases: tuple[str, ...] = (),
) -> Method:
    """A DS-Sync preset: one :class:`~dssync.strategies.DSSync` with ``options``.

    ``options`` holds the preset's defaults of :data:`OPTIONS` (``--every`` etc. override them)
    and how its groups are made (``plan``: ``schedule``, ``topology``, ``global`` or
    ``exp-gossip``; ``pairs``; ``spread``). A topology plan needs the topology and its rates.
    """
    shape = {k: v for k, v in options.items() if k in _SHAPE}
    needs = _TOPO_RATES if shape.get("plan") == "topology" else frozenset()
    return Method(
        name,
        description,
        functools.partial(_dssync, **shape),
        needs=needs,
        settings=settings or {},
        aliases=aliases,
        options=options,
        takes=frozenset(OPTIONS),
        preset=True,
    )


_TOPOLOGY = {"plan": "topology", "replan": 8}  # re-planned from timings every 8 averagings

# The table. Each line: name, what it does (shown in --help), and how it is made: a DS-Sync
# preset (a dict of options), or a builder and what it needs.
_TABLE = [
    preset("dssync", "DS-Sync: average within groups that change every step", {}),
    Method("bsp", "DDP: all-reduce of gradients every step", _bsp, aliases=("ddp",)),
    Method(
        "local-sgd",
        "local SGD: global average of parameters every --every steps (4)",
        _local_sgd,
        options={"every": 4},
        takes=frozenset({"every"}),
    ),
    preset(
        "diloco",
        "DiLoCo: global average of pseudo-gradients every --every steps (4), outer Nesterov "
        "(none after Adam-family steps)",
        {"plan": "global", "every": 4, "outer": "auto"},
    ),
    Method(
        "hierarchical",
        "all-reduce in each host or rack, then among leaders",
        _hierarchical,
        needs=_TOPO,
    ),
    preset("dssync-topo", "DS-Sync with topology-aware groups, re-planned from timings", _TOPOLOGY),
    preset(
        "dssync-topo-local",
        "topology-aware DS-Sync, re-planned, averaging every 4th step (local steps between)",
        {**_TOPOLOGY, "every": 4},
    ),
    preset(
        "dssync-local",
        "DS-Sync in shuffled pairs every 4th step with DiLoCo's outer Nesterov (DiLoCo in pairs; "
        "none after Adam-family steps)",
        {"every": 4, "outer": "auto"},
    ),
    preset(
        "dssync-topo-whole",
        "topology-aware DS-Sync whose crossings go whole every few steps, not spread (ablation)",
        {**_TOPOLOGY, "spread": False},
    ),
    preset(
        "dssync-static",
        "DS-Sync on fixed groups that never shuffle (ablation)",
        {},
        settings={"schedule": "static"},
    ),
    preset(
        "dssync-allreduce",
        "DS-Sync with pairs by all_reduce on groups made at start (to compare the pair path)",
        {"pairs": "all_reduce"},
        settings={"schedule": "shuffle"},
    ),
    preset(
        "dssync-overlap",
        "DS-Sync whose group average runs behind the next step's compute (merged a step later)",
        {"overlap": True},
    ),
    preset(
        "dssync-topo-overlap",
        "overlapped DS-Sync on a fixed topology-aware plan made at start",
        {"plan": "topology", "overlap": True},
    ),
    Method(
        "powersgd",
        "DDP with PyTorch's PowerSGD hook (rank --powersgd-rank, error feedback)",
        _powersgd,
    ),
    Method("fp16", "DDP with PyTorch's fp16 hook: gradients all-reduced in half precision", _fp16),
    Method("dpsgd", "D-PSGD: average with both ring neighbours every step", _dpsgd),
    preset(
        "exp-gossip",
        "one peer per step on the exponential graph (power-of-2 workers)",
        {"plan": "exp-gossip"},
    ),
    Method(
        "dssync-async",
        "wait-avoiding DS-Sync: active/passive pairs, passives answer from a thread",
        _dssync_async,
    ),
    Method(
        "auto",
        "the method the planner predicts fastest here, from a link probe and the measured compute",
        _auto,
        needs=_TOPO_RATES,
        takes=frozenset(OPTIONS),  # passed on to the chosen method where it takes them
    ),
    Method(
        "solo",
        "no averaging while training, one at the end: the control a time-to-train target must fail",
        _solo,
    ),
    Method("asp", "parameter server in rank 0's process; workers never wait (ASP)", _asp),
    Method("ssp", "parameter server; fastest worker at most --staleness steps ahead (SSP)", _ssp),
    # elastic: replicas that come and go, on torchft (pip install 'dssync[elastic]')
    _elastic_method(
        "elastic-dssync",
        "DS-Sync on torchft's live replicas (ElasticDSSync): a lost replica costs its group one "
        "averaging; elastic",
        1,
    ),
    _elastic_method(
        "torchft-diloco",
        "torchft's own DiLoCo (torchft.local_sgd): pseudo-gradients all-reduced over the quorum "
        "every --every steps (4), outer Nesterov; elastic",
        4,
    ),
    _elastic_method(
        "torchft-local-sgd",
        "torchft's own LocalSGD (torchft.local_sgd): parameters all-reduced over the quorum "
        "every --every steps (4); elastic",
        4,
    ),
]
METHODS: dict[str, Method] = {m.name: m for m in _TABLE}
# What `dssync compare` runs unless --methods says otherwise: the baseline and the recommended
# DS-Sync method, so a first run answers "is DS-Sync as good as DDP here, and faster?".
DEFAULT_METHODS: tuple[str, ...] = ("bsp", "dssync")
ALIASES: dict[str, str] = {a: m.name for m in METHODS.values() for a in m.aliases}


def method_names(variants: bool = True) -> list[str]:
    """Names of the methods, in table order (without the variants and the elastic methods,
    which need torchft, when ``variants`` is False: what ``all`` means)."""
    return [n for n, m in METHODS.items() if variants or not (m.variant or ELASTIC in m.needs)]


def is_elastic(name: str) -> bool:
    """Whether method ``name`` runs on torchft's elastic launcher (one process per replica)."""
    return ELASTIC in get_method(name).needs


def choices() -> list[str]:
    """Every name a user may type: the methods and their aliases."""
    return [*METHODS, *ALIASES]


def get_method(name: str) -> Method:
    """The method called ``name`` (or one of its aliases, or a label of it with options, as
    :func:`split_label` reads them); UsageError naming the known ones."""
    base = name.split(LABEL_SEP)[0].strip()
    method = METHODS.get(ALIASES.get(base, base))
    if method is None:
        raise UsageError(f"unknown method {base!r}; choose from {', '.join(choices())}")
    return method


LABEL_SEP = ":"
# What a label may set beyond the OPTIONS, with the type its value takes.
_LABEL_EXTRA: dict[str, Any] = {"outer_lr": 0.0, "group_size": GROUP_SIZE}
_LABEL_KEYS = (*OPTIONS, *_LABEL_EXTRA)


def split_label(label: str) -> tuple[str, dict[str, Any]]:
    """A method with some of its options set, so that one comparison can race several settings
    of one method: ``"dssync-topo-local:wire=int8:every=16"`` ->
    ``("dssync-topo-local", {"wire": "int8", "every": 16})``. Keys are the :data:`OPTIONS`,
    ``outer-lr`` and ``group-size``; a label's options win over those given to the whole command.

    Example::

        >>> split_label("diloco:every=16:outer-lr=0.5")
        ('diloco', {'every': 16, 'outer_lr': 0.5})
    """
    name, *parts = (p.strip() for p in label.split(LABEL_SEP))
    options: dict[str, Any] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in _LABEL_KEYS:
            keys = ", ".join(k.replace("_", "-") for k in _LABEL_KEYS)
            raise UsageError(
                f"{label!r}: {part!r} is not KEY=VALUE with KEY one of {keys} "
                f"(for example dssync-topo{LABEL_SEP}every=4{LABEL_SEP}wire=int8)"
            )
        options[key] = _option_value(key, value.strip(), label)
    return name, options


def _option_value(key: str, value: str, label: str) -> Any:
    default = OPTIONS.get(key, _LABEL_EXTRA.get(key))
    allowed = {"wire": WIRES, "outer": OUTERS, "overlap": ("true", "false")}.get(key)
    if allowed is not None and value.lower() not in allowed:
        raise UsageError(f"{label!r}: {key}={value!r}; choose from {', '.join(allowed)}")
    if isinstance(default, bool):
        return value.lower() == "true"
    kind = {int: "a whole number", float: "a number"}.get(type(default))
    if kind is None:
        return value
    try:
        return type(default)(value)
    except ValueError:
        raise UsageError(f"{label!r}: {key}={value!r} is not {kind}") from None


def parse_methods(text: str) -> list[str]:
    """A comma-separated list of names (or ``all``: every method but the variants), checked."""
    if text.strip() == "all":
        return method_names(variants=False)
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise UsageError(f"no method given; pass a comma-separated list of {', '.join(choices())}")
    for name in names:
        get_method(name)
        split_label(name)
    return names


def help_text(names: Iterable[str] | None = None) -> str:
    """``name: description`` of each method, for a command's ``--help``."""
    return "; ".join(f"{n}: {get_method(n).description}" for n in (names or method_names()))


def configure(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the settings its method fixes (a variant's schedule, for example) and its
    preset's options where the user gave none, so the run's config records the options used.

    An option the method does not take (``--every`` with ``bsp``, say) is a UsageError.
    """
    method = get_method(cfg.sync)
    given = [k for k in OPTIONS if getattr(cfg, k) is not None]
    odd = [k for k in given if k not in method.takes]
    if odd:
        flags = ", ".join(f"--{k}" for k in odd)
        takers = [n for n, m in METHODS.items() if set(odd) <= m.takes]
        raise UsageError(
            f"{cfg.sync} does not take {flags}; drop it, or use a method that does: "
            f"{', '.join(takers)}"
        )
    # auto passes on only what was given: its pick's preset fills the rest.
    if method.build is _auto:
        return replace(cfg, **method.settings)
    filled = {
        k: preset_value(cfg.sync, k)
        for k in OPTIONS
        if k in method.takes and getattr(cfg, k) is None
    }
    if cfg.group_size is None:
        filled["group_size"] = preset_value(cfg.sync, "group_size")
    return replace(cfg, **method.settings, **filled)


def preset_value(name: str, option: str) -> Any:
    """What method ``name`` runs for ``option`` (one of ``OPTIONS``, or ``group_size``) when it
    is not given: the preset's own value, else the default."""
    if option == "group_size":
        return GROUP_SIZE
    return get_method(name).options.get(option, OPTIONS[option])


def for_method(cfg: TrainConfig, name: str) -> TrainConfig:
    """``cfg`` for method ``name``, leaving out the options it does not take (``compare`` runs
    several methods with one set of options: ``--every 4`` reaches dssync and local-sgd, not
    bsp); a label's own options (:func:`split_label`) are set, and must be ones it takes."""
    base, own = split_label(name)
    takes = get_method(base).takes
    odd = [k for k in own if k in OPTIONS and k not in takes]
    if odd:
        raise UsageError(f"{name!r}: {base} does not take {', '.join(odd)}; drop it from the label")
    return replace(cfg, sync=base, **{k: None for k in OPTIONS if k not in takes}, **own)


def with_pick(
    cfg: TrainConfig,
    method: str,
    every: int | None = None,
    outer: str | None = None,
    group_size: int | None = None,
    wire: str | None = None,
) -> TrainConfig:
    """``cfg`` for ``auto``'s pick: ``method`` (:func:`for_method`), with the pick's ``every``,
    ``outer``, ``group_size`` and ``wire`` where the user gave none of them (None: the method's
    own)."""
    chosen = for_method(cfg, method)
    picked = {"every": every, "outer": outer, "group_size": group_size, "wire": wire}
    given = {k: v for k, v in picked.items() if getattr(cfg, k) is None and v is not None}
    return replace(chosen, **given)


def build_strategy(
    cfg: TrainConfig,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    topology: Topology | None = None,
) -> Strategy:
    """The strategy ``cfg.sync`` names, wrapping ``module``.

    A method that needs the topology detects it when ``topology`` is None.
    """
    method = get_method(cfg.sync)
    return method.build(configure(cfg), module, optimizer, topology)
