"""The hook points: DSSync calls every hook at each point in the declared order, and no hook
reaches into its host's private state."""

from __future__ import annotations

import ast
import inspect

import pytest
from torch import nn

import dssync.strategies.before_step
import dssync.strategies.hooks
import dssync.strategies.outer
import dssync.strategies.overlap
import dssync.strategies.replan
from dssync import DSSync, Global
from dssync.lab.launch import spawn
from dssync.strategies.hooks import Hook


class Recorder(Hook):
    """Writes down each point it is called at."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_send(self, ctx) -> None:
        self.calls.append(f"send {ctx.t} deferred={ctx.deferred}")

    def around(self, ctx, average) -> None:
        self.calls.append("around")
        average()

    def before_merge(self, host) -> None:
        self.calls.append("before_merge")

    def merge(self, host) -> bool:
        self.calls.append("merge")
        return False

    def after_merge(self, host) -> None:
        self.calls.append("after_merge")

    def after_average(self, ctx) -> None:
        self.calls.append(f"after_average {ctx.host.averagings}")


def _points() -> list[list[str]]:
    out = []
    for overlap in (False, True):
        sync = DSSync(nn.Linear(4, 2), Global(), overlap=overlap)
        recorder = Recorder()
        sync.hooks.insert(0, recorder)  # outermost: the overlap hook's around is its average()
        sync.step()
        sync.step()
        sync.finish()
        sync.close()
        out.append(recorder.calls)
    return out


def test_dssync_calls_each_hook_point_in_the_declared_order():
    for blocking, overlapped in spawn(_points, 2, timeout_s=120):
        one = ["before_merge", "around", "after_merge"]
        assert blocking == [
            "send 0 deferred=False",
            *one,
            "after_average 1",
            "send 1 deferred=False",
            *one,
            "after_average 2",
        ], blocking  # finish() and close() land nothing: no hook defers
        # the mean of averaging t lands at t + 1, before its send; finish() lands the last, and
        # close() finishes again (nothing left to land)
        landing = ["before_merge", "merge", "after_merge"]
        assert overlapped == [
            *landing,
            "send 0 deferred=True",
            "around",
            "after_average 1",
            *landing,
            "send 1 deferred=True",
            "around",
            "after_average 2",
            *landing,
            *landing,
        ], overlapped


@pytest.mark.parametrize(
    "module",
    [
        dssync.strategies.hooks,
        dssync.strategies.outer,
        dssync.strategies.overlap,
        dssync.strategies.replan,
        dssync.strategies.before_step,
    ],
)
def test_no_hook_touches_its_hosts_private_state(module):
    tree = ast.parse(inspect.getsource(module))
    private = [
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and isinstance(node.value, ast.Name)
        and node.value.id in {"host", "sync", "ctx"}
    ]
    hosts = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and isinstance(node.value, ast.Attribute)
        and node.value.attr in {"host", "sync"}
    ]
    assert not private and not hosts, private
