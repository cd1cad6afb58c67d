"""The `dssync` command line. Each command lives in its own module; this file joins them."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import click

from dssync.lab.cli import errors
from dssync.lab.cli.train_cmd import train
from dssync.lab.launch import exit_quietly, launched_externally


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="dssync")
def cli() -> None:
    """DS-Sync: divide-and-shuffle synchronization for data-parallel PyTorch training."""


cli.add_command(train)


def _register_optional() -> None:
    """Commands whose modules may pull heavier imports are registered here."""
    from dssync.lab.cli.bench_cmd import bench
    from dssync.lab.cli.bench_sync_cmd import bench_sync
    from dssync.lab.cli.cluster_cmd import cluster
    from dssync.lab.cli.compare_cmd import compare_cmd
    from dssync.lab.cli.plan_cmd import plan
    from dssync.lab.cli.straggler_cmd import bench_straggler

    cli.add_command(bench)
    cli.add_command(bench_sync)
    cli.add_command(cluster)
    cli.add_command(compare_cmd, "compare")
    cli.add_command(bench_straggler)
    cli.add_command(plan)


_register_optional()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is so that it cleans up as after Ctrl-C: the processes
    it started are killed, an emulated cluster is torn down."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input exits 2 with one line naming the problem and the fix; ranks out of
    step or a lost peer exit 1 with one line naming them; any other exception is a bug: its
    traceback, exit 1 (see :mod:`dssync.lab.cli.errors`). Ctrl-C exits 130 and SIGTERM 143, each
    after the command killed every process it started (a rank under torchrun keeps torchrun's
    SIGTERM: its agent stops it)."""
    if not launched_externally() and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Abort as e:  # click's wrapping of a KeyboardInterrupt
        if isinstance(e.__cause__, Terminated):
            click.echo("terminated", err=True)
            sys.exit(143)
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:  # a bad flag or value: one line, no usage block
        hint = f"; see '{e.ctx.command_path} --help'" if e.ctx is not None else ""
        click.echo(f"error: {e.format_message().rstrip('.')}{hint}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except Terminated:
        click.echo("terminated", err=True)
        sys.exit(143)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - every failure is reported by its kind
        sys.exit(errors.report(e))
    if launched_externally():
        exit_quietly(
            0
        )  # a torchrun rank whose work is written: skip finalization (see exit_quietly)
