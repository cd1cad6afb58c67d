"""The `dssync` command line. Each command lives in its own module; this file joins them."""

from __future__ import annotations

import sys

import click

from dssync.cli.errors import is_user_error, user_error_message
from dssync.cli.train_cmd import train
from dssync.launch import exit_quietly, launched_externally


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="dssync")
def cli() -> None:
    """DS-Sync: divide-and-shuffle synchronization for data-parallel PyTorch training."""


cli.add_command(train)


def _register_optional() -> None:
    """Commands whose modules may pull heavier imports are registered here."""
    from dssync.cli.bench_cmd import bench
    from dssync.cli.bench_sync_cmd import bench_sync
    from dssync.cli.cluster_cmd import cluster
    from dssync.cli.compare_cmd import compare_cmd
    from dssync.cli.plan_cmd import plan
    from dssync.cli.straggler_cmd import bench_straggler

    cli.add_command(bench)
    cli.add_command(bench_sync)
    cli.add_command(cluster)
    cli.add_command(compare_cmd, "compare")
    cli.add_command(bench_straggler)
    cli.add_command(plan)


_register_optional()


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input exits with code 2 and one line that names the problem and the fix."""
    try:
        cli.main(args=argv, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:  # a bad flag or value: one line, no usage block
        hint = f"; see '{e.ctx.command_path} --help'" if e.ctx is not None else ""
        click.echo(f"error: {e.format_message().rstrip('.')}{hint}", err=True)
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as e:
        if not is_user_error(e):
            raise
        click.echo(f"error: {user_error_message(e)}", err=True)
        sys.exit(2)
    if launched_externally():
        exit_quietly(0)  # a torchrun rank whose work is written: skip finalization (see exit_quietly)
