"""One table printer for the demo and the benchmark: ``rich`` when installed, plain columns otherwise."""
from __future__ import annotations

import sys


def print_table(title: str, headers, rows, file=None) -> None:
    """``rows`` are tuples of strings, one per header; columns 3-8 (numbers) are right-aligned."""
    file = file or sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title, file=file)
        widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
        for row in (headers, *rows):
            print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)), file=file)
        return
    table = Table(title=title, title_justify="left")
    for i, h in enumerate(headers):
        table.add_column(h, justify="right" if 2 <= i <= 7 else "left")
    for row in rows:
        table.add_row(*row)
    Console(file=file, width=max(160, Console(file=file).width)).print(table)
