"""The look of every table the command line prints: plain rules, no frame, 80 columns.

A boxed table spends three columns of frame on each column of figures; these tables draw one
rule under the header and separate columns by two spaces, so a method name and six figures fit
an 80-column terminal or a piped log (rich renders a non-terminal 80 wide).

Example::

    t = compact_table("mnist on 4 workers", ["method", "accuracy"])
    t.add_row("dssync", "0.9743")
"""

from __future__ import annotations

from collections.abc import Iterable

from rich import box
from rich.table import Table

WIDTH = 80  # what every table must fit


def compact_table(title: str | None, columns: Iterable[str], left: int = 1) -> Table:
    """A table with ``columns`` (a header may hold a newline); the first ``left`` are text
    (left-aligned), the rest figures (right-aligned)."""
    t = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i < left else "right")
    return t
