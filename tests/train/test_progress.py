"""Progress off a terminal: one plain line per tenth of the run, on rank 0 only, none when quiet."""

from __future__ import annotations

import io
import re

from dssync.lab.config import TrainConfig
from dssync.lab.train.progress import Progress

LINE = re.compile(
    r"^dssync mnist: step (\d+)/(\d+) \((\d+)%\), epoch (\d+)/(\d+), loss (\d+\.\d{4}), (\d+\.\d) s$"
)


def _run(progress: Progress, steps: range) -> None:
    for step in steps:
        progress.update(step, 1.0 / step)
    progress.close()


def test_piped_output_gets_a_line_per_tenth_with_step_epoch_loss_and_time():
    out = io.StringIO()
    _run(Progress(137, 40, label="dssync mnist", stream=out, terminal=False), range(1, 138))
    found = [LINE.match(line) for line in out.getvalue().splitlines()]
    assert len(found) == 10 and all(found), out.getvalue()
    steps = [int(m[1]) for m in found]
    assert steps == sorted(set(steps)) and steps[-1] == 137
    # Each line comes at the first step past its tenth, so no gap is longer than a tenth.
    assert all(b - a <= 137 // 10 + 1 for a, b in zip([0, *steps], steps, strict=False))
    assert [int(m[3]) for m in found][-1] == 100 and {int(m[5]) for m in found} == {4}
    assert [int(m[4]) for m in found] == [(s - 1) // 40 + 1 for s in steps]
    assert found[0][6] == f"{1 / steps[0]:.4f}"


def test_a_short_run_prints_every_step_and_a_resumed_one_only_what_is_left():
    out = io.StringIO()
    _run(Progress(4, 2, label="x", stream=out, terminal=False), range(1, 5))
    assert [ln.split(",")[0] for ln in out.getvalue().splitlines()] == [
        f"x: step {s}/4 ({25 * s}%)" for s in range(1, 5)
    ]
    out = io.StringIO()
    _run(Progress(100, 10, done=50, stream=out, terminal=False), range(51, 101))
    assert [ln.split(" ")[1] for ln in out.getvalue().splitlines()] == [
        f"{s}/100" for s in range(60, 101, 10)
    ]


def test_quiet_runs_and_other_ranks_print_nothing():
    for cfg, rank in ((TrainConfig(progress=False), 0), (TrainConfig(), 1)):
        progress = Progress.of(cfg, rank, 50, 0, 10)
        progress.stream = out = io.StringIO()
        _run(progress, range(1, 51))
        assert out.getvalue() == "" and progress.bar is None


def test_a_terminal_gets_the_bar_instead_of_lines():
    out = io.StringIO()
    progress = Progress(20, 5, label="dssync mnist", stream=out, terminal=True)
    _run(progress, range(1, 21))
    assert "20/20" in out.getvalue() and not LINE.search(out.getvalue().replace("\r", "\n"))


def test_a_terminal_of_unknown_size_still_gets_a_bar_with_the_step_count():
    """From outside: under a pty nobody had sized (0 columns), tqdm drew a bar of no width, so a
    terminal showed no progress at all. The bar now falls back to 80 columns there."""
    import os
    import pty

    master, slave = pty.openpty()  # a fresh pty: 0 rows and 0 columns
    try:
        assert os.get_terminal_size(slave).columns == 0

        class Terminal(io.StringIO):  # what is written, on the pty's descriptor
            def isatty(self) -> bool:
                return True

            def fileno(self) -> int:
                return slave

        out = Terminal()
        progress = Progress(30, 10, label="dssync mnist", stream=out)
        assert progress.bar is not None, "no bar on a terminal"
        for step in range(1, 31):
            progress.update(step, 0.5)
        progress.bar.refresh()
        assert progress.bar.ncols == 80
        assert "dssync mnist" in out.getvalue() and "30/30" in out.getvalue(), out.getvalue()
    finally:
        os.close(slave)
        os.close(master)
