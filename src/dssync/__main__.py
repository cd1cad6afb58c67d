"""The `dssync` command (also `python -m dssync ...`, what torchrun runs:
`torchrun --nproc-per-node 4 -m dssync train ...`).

The command belongs to the lab layer: without the `lab` extra it says so in one line.
"""

from __future__ import annotations

import importlib.util
import sys

# What `pip install 'dssync[lab]'` adds (import names), checked before the CLI is imported.
LAB_MODULES = ("click", "rich", "tqdm", "matplotlib", "sklearn", "mlxtend")


def main() -> None:
    """Run the CLI, or exit 2 with one line when the lab extra is not installed."""
    missing = [m for m in LAB_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"error: the dssync command needs the lab extra ({', '.join(missing)} not installed);"
            " install it with: pip install 'dssync[lab]'",
            file=sys.stderr,
        )
        sys.exit(2)
    from dssync.lab.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
