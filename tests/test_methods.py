"""The method registry: names, aliases, help, errors, and what each builder builds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dssync.errors import UsageError
from dssync.lab.baselines import BSP, Hierarchical, LocalSGD
from dssync.lab.baselines.ps import ParameterServer
from dssync.lab.config import TrainConfig
from dssync.lab.launch import spawn
from dssync.lab.methods import (
    METHODS,
    build_strategy,
    choices,
    get_method,
    help_text,
    is_elastic,
    method_names,
    parse_methods,
)
from dssync.schedules import Shuffle, Static
from dssync.strategies import DSSync
from dssync.topology import Topology


def test_every_name_resolves_and_aliases_keep_old_names():
    assert get_method("ddp") is METHODS["bsp"]
    for name in choices():
        assert get_method(name).description
    assert len(set(choices())) == len(choices())


def test_unknown_name_is_a_usage_error_listing_the_known_ones():
    with pytest.raises(
        UsageError, match="unknown method 'telepathy'; choose from dssync, bsp"
    ) as info:
        get_method("telepathy")
    assert all(n in str(info.value) for n in choices())
    with pytest.raises(UsageError, match="carrier-pigeon"):
        parse_methods("dssync,carrier-pigeon")
    with pytest.raises(UsageError, match="no method given"):
        parse_methods(" , ")


def test_all_leaves_out_variants_and_lists_keep_their_order():
    assert parse_methods("all") == method_names(variants=False)
    assert "dssync-static" in method_names() and "dssync-static" not in parse_methods("all")
    assert parse_methods(" ddp, dssync ") == ["ddp", "dssync"]


def test_help_names_each_method_with_its_description():
    text = help_text()
    for name, m in METHODS.items():
        assert f"{name}: {m.description}" in text


def _builds() -> dict[str, tuple[str, str]]:
    torch.manual_seed(0)
    topo = Topology(hosts=(0, 1), racks=(0, 0))
    out = {}
    for name in choices():
        if is_elastic(name):  # one process per replica on torchft: tests/elastic
            continue
        module = nn.Linear(3, 2)
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        cfg = TrainConfig(sync=name, repeat=4, timeout_s=30)
        s = build_strategy(cfg, module, opt, topology=topo)
        schedule = getattr(s, "schedule", None)
        extra = type(schedule).__name__ if schedule is not None else ""
        if isinstance(s, Hierarchical):
            extra += f" topology given: {s.topology.hosts == topo.hosts}"
        if isinstance(s, DSSync) and s.replanner is not None:
            extra += f" topology given: {s.replanner.topology.hosts == topo.hosts}"
            extra += f" replan every {s.replan}"
        if isinstance(s, DSSync) and (s.every > 1 or s.outer is not None or s.overlap):
            extra += f" every {s.every} outer {s.outer is not None} overlap {s.overlap}"
        if isinstance(s, LocalSGD):
            extra += f"every {s.every}"
        if isinstance(s, ParameterServer):
            extra += f"staleness {s.staleness}"
        if isinstance(s, DSSync) and isinstance(schedule, Shuffle):
            extra += f" repeat {schedule.cycle(2)}"
        out[name] = (type(s).__name__, extra)
    return out


def test_builders_build_the_named_strategy_with_the_config():
    built = spawn(_builds, 2, timeout_s=120)[0]
    assert built["bsp"] == built["ddp"] == (BSP.__name__, "")
    assert built["local-sgd"] == (LocalSGD.__name__, "every 4")
    assert built["dssync"] == (DSSync.__name__, "Shuffle repeat 4")
    assert built["dssync-static"] == (DSSync.__name__, Static.__name__)
    assert built["hierarchical"] == (Hierarchical.__name__, " topology given: True")
    assert built["dssync-topo"][0] == DSSync.__name__
    assert built["dssync-topo"][1].endswith("topology given: True replan every 8")
    assert built["dssync-topo-local"][1].endswith(
        "replan every 8 every 4 outer False overlap False"
    )
    assert "every 1 outer False overlap True" in built["dssync-overlap"][1]
    assert built["diloco"] == (DSSync.__name__, "Global every 4 outer True overlap False")
    assert "every 4 outer True overlap False" in built["dssync-local"][1]
    assert built["asp"] == (ParameterServer.__name__, "staleness None")
    assert built["ssp"] == (ParameterServer.__name__, "staleness 2")  # TrainConfig's default


@pytest.mark.parametrize(
    "args",
    [
        ["compare", "--methods", "bsp,telepathy"],
        ["bench", "--method", "telepathy", "--scenario", "tiny"],
        ["bench-straggler", "--methods", "telepathy"],
    ],
)
def test_every_command_reports_an_unknown_method_the_same_way(args, capsys):
    from dssync.lab.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: unknown method 'telepathy'; choose from {', '.join(choices())}"]


def test_a_preset_fills_its_options_and_the_user_overrides_them():
    from dssync.lab.methods import configure

    topo = configure(TrainConfig(sync="dssync-topo"))
    assert (topo.every, topo.replan, topo.overlap, topo.outer) == (1, 8, False, "none")
    mine = configure(TrainConfig(sync="dssync-topo", every=4, replan=16))
    assert (mine.every, mine.replan) == (4, 16)
    assert configure(TrainConfig(sync="diloco")).outer == "auto"
    assert configure(TrainConfig(sync="local-sgd", every=8)).every == 8
    assert configure(TrainConfig(sync="bsp")).every is None  # bsp takes no option


def _optimizer_given():
    out = {}
    for kind in (torch.optim.AdamW, torch.optim.SGD):
        module = nn.Linear(3, 2)
        s = build_strategy(
            TrainConfig(sync="dssync", timeout_s=30), module, kind(module.parameters())
        )
        out[kind.__name__] = (s.before_step is not None, s.optimizer is not None)
    return out


def test_ds_sync_presets_hand_an_adam_family_optimizer_to_dssync():
    # Without it the lab's dssync ran Adam with parameters only (+6.4% loss on lm at 4 ranks)
    given = spawn(_optimizer_given, 2, timeout_s=60)[0]
    assert given == {"AdamW": (True, True), "SGD": (False, False)}


def _built_with_wire():
    module = nn.Linear(3, 2)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    s = build_strategy(
        configure_cfg(TrainConfig(sync="diloco", wire="int8", fragments=2, timeout_s=30)),
        module,
        opt,
        topology=Topology(hosts=(0, 1), racks=(0, 0)),
    )
    return s.wire, s.schedule.describe()


def configure_cfg(cfg: TrainConfig) -> TrainConfig:
    from dssync.lab.methods import configure

    return configure(cfg)


def test_wire_and_fragments_reach_every_ds_sync_preset_and_no_other():
    wire, schedule = spawn(_built_with_wire, 2, timeout_s=60)[0]
    assert wire == "int8" and schedule.startswith("Fragments(Global") and "fragments=2" in schedule
    assert configure_cfg(TrainConfig(sync="dssync-topo")).wire == "fp32"
    with pytest.raises(UsageError, match="bsp does not take --wire"):
        configure_cfg(TrainConfig(sync="bsp", wire="int8"))
    with pytest.raises(UsageError, match="local-sgd does not take --fragments"):
        configure_cfg(TrainConfig(sync="local-sgd", fragments=2))


def test_an_option_the_method_does_not_take_is_refused_naming_who_does():
    from dssync.errors import UsageError
    from dssync.lab.methods import configure

    with pytest.raises(UsageError, match="bsp does not take --every.*local-sgd") as e:
        configure(TrainConfig(sync="bsp", every=4))
    assert "dssync" in str(e.value)
    with pytest.raises(UsageError, match="local-sgd does not take --outer"):
        configure(TrainConfig(sync="local-sgd", outer="nesterov"))


def test_every_default_list_of_methods_names_methods_of_the_table():
    """The commands' default subsets are names from the one table (plan.cost's are model labels)."""
    from dssync.lab.experiments.cluster_bench import BLOCKING
    from dssync.lab.experiments.cluster_bench import METHODS as BENCH
    from dssync.lab.experiments.straggler import DEFAULT_METHODS as STRAGGLER
    from dssync.lab.methods import DEFAULT_METHODS, get_method
    from dssync.lab.plan.local import METHODS as LOCAL
    from dssync.lab.plan.validate import BENCH_METHODS

    for name in (*BENCH, *STRAGGLER, *DEFAULT_METHODS, *LOCAL, *BENCH_METHODS, *BLOCKING):
        get_method(name)  # raises UsageError for a name the table does not know
    for overlapped, blocking in BLOCKING.items():
        assert get_method(overlapped).options.get("overlap") is True
        assert not get_method(blocking).options.get("overlap")


def test_auto_passes_the_options_given_to_the_method_it_chooses():
    from dssync.lab.methods import configure, for_method

    given = configure(TrainConfig(sync="auto", every=4))
    assert (given.every, given.replan) == (4, None)  # nothing filled before the choice
    chosen = configure(for_method(given, "dssync-topo"))
    assert (chosen.every, chosen.replan) == (4, 8)  # the chosen preset fills the rest
    assert configure(for_method(given, "bsp")).every is None


def test_a_label_sets_options_of_one_method_and_bad_labels_name_the_fix():
    from dssync.lab.methods import for_method, parse_methods, split_label

    assert split_label("diloco:every=16:outer-lr=0.5") == ("diloco", {"every": 16, "outer_lr": 0.5})
    cfg = for_method(TrainConfig(every=2), "dssync-topo-local:wire=int8:every=16")
    assert (cfg.sync, cfg.wire, cfg.every) == ("dssync-topo-local", "int8", 16)
    assert for_method(TrainConfig(every=2), "dssync-topo-local").every == 2  # the command's
    assert parse_methods("bsp,dssync:overlap=true") == ["bsp", "dssync:overlap=true"]
    for bad, says in [
        ("dssync:every=x", "not a whole number"),
        ("dssync:wire=int9", "choose from fp32"),
        ("dssync:foo=1", "KEY=VALUE"),
        ("nope:every=2", "unknown method 'nope'"),
    ]:
        with pytest.raises(UsageError, match=says):
            parse_methods(bad)
    with pytest.raises(UsageError, match="bsp does not take every"):
        for_method(TrainConfig(), "bsp:every=4")


def test_the_local_step_presets_apply_no_outer_step_after_adam():
    """On lm with AdamW, DiLoCo's outer Nesterov step at every=4-16 lost 16-45% validation loss
    against 3-7% without it (docs/guide/adam.md): the presets leave it out after Adam's steps,
    keep it after SGD's, and keep it where --outer nesterov asks."""
    spawn(_outer_of, 2, timeout_s=60)


def _outer_of() -> None:
    import torch.distributed as dist

    from dssync.lab.methods import build_strategy

    for name, opt_cls, outer, want in [
        (name, opt_cls, outer, want)
        for name in ("diloco", "dssync-local")
        for opt_cls, outer, want in [
            (torch.optim.AdamW, None, None),
            (torch.optim.SGD, None, "nesterov"),
            (torch.optim.AdamW, "nesterov", "nesterov"),
        ]
    ]:
        model = nn.Linear(4, 2)
        opt = opt_cls(model.parameters(), lr=0.1)
        sync = build_strategy(TrainConfig(sync=name, outer=outer), model, opt)
        got = None if sync.options.outer is None else "nesterov"
        assert got == want, (name, opt_cls.__name__, outer, sync.options.outer)
        sync.close()
    dist.barrier()
