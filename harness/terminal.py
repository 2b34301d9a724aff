"""Tables that fit the terminal: whole low-priority columns are left out (and named), free text is wrapped,
no value is ever cut."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

# Free text (a reason, a hint) is wrapped no narrower than this while other columns can still be left out.
MIN_WRAP_WIDTH = 24
# rich's box.SIMPLE_HEAD without outer edges: one space of padding each side of a cell, one separator between
# cells (rich.table.Table._extra_width).
CELL_PADDING = 2
SEPARATOR = 1


@dataclass(frozen=True)
class Column:
    """One column: `priority` 0 is always shown, higher numbers are left out first when the terminal is narrow;
    `wrap` marks free text, wrapped at word boundaries instead of widening the table."""

    header: str
    priority: int = 0
    justify: str = "left"
    wrap: bool = False


Cell = Union[str, Any]  # a str or a rich Text (which keeps its styles)


def terminal_width(stream: Any = None) -> Optional[int]:
    """The width to fit: COLUMNS when set, else the terminal's; None when the output is a pipe or a file.

    A pipe has no width to fit: squeezing to a guessed 80 columns cuts what `grep`, `less -S` or a log needs,
    so piped output is printed at its natural width (set COLUMNS to fit a pipe to a width)."""
    stream = stream or sys.stdout
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        pass
    return None


def fit_text(text: str, width: Optional[int]) -> str:
    """`text` (a "[harness] ..." note, a block of report lines) fitted to `width`: each line longer than it is
    wrapped at spaces, its continuation lines indented two more than the line itself so that they read as one;
    a word wider than that (a long path) is split across lines, as a table cell folds it: never cut. `width`
    None (a pipe without COLUMNS): every line as it is."""
    import textwrap

    if width is None:
        return text
    out = []
    for line in text.splitlines() or [""]:
        indent = " " * (len(line) - len(line.lstrip(" ")))
        if len(line) <= width or width <= len(indent) + 2 + MIN_WRAP_WIDTH // 2:
            out.append(line)
            continue
        out += textwrap.wrap(line.lstrip(" "), width, initial_indent=indent, subsequent_indent=indent + "  ",
                             break_on_hyphens=False, break_long_words=True) or [line]
    return "\n".join(out)


def print_fitted(text: str, stream: Any = None) -> None:
    """Print `text` fitted to the width of `stream` (terminal_width: COLUMNS, else the terminal's, else as is)."""
    stream = stream or sys.stdout
    try:
        print(fit_text(text, terminal_width(stream)), file=stream, flush=True)
    except BrokenPipeError:
        silence(stream)


def silence(stream: Any) -> None:
    """After a write to `stream` found its reader gone (`| head`, a closed `less`): its file descriptor points at
    /dev/null from then on, so later lines and the flush at exit succeed unseen, and a run goes on to write its
    results to its own files (Python's signal module docs, "Note on SIGPIPE"; rich's Console does the same for
    the tables it prints, then exits 1). A stream without a descriptor (a test's capture) is left as it is."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _text(cell: Cell) -> Any:
    from rich.text import Text

    return cell if isinstance(cell, Text) else Text(str(cell))  # Text, not markup: cells quote errors and paths


def table_width(widths: Sequence[int]) -> int:
    """The printed width of a table whose cells are `widths` wide."""
    return sum(width + CELL_PADDING for width in widths) + SEPARATOR * max(len(widths) - 1, 0)


@dataclass(frozen=True)
class Fitted:
    """The columns shown (indices) with their widths, and the headers left out."""

    widths: Dict[int, int]
    dropped: List[str]


def fit_columns(columns: Sequence[Column], natural: Sequence[int], width: Optional[int],
                longest_word: Sequence[int] = ()) -> Fitted:
    """Leave out the highest-priority-number columns (the rightmost first among equals) until the rest fit
    `width` with free text wrapped at MIN_WRAP_WIDTH (or its longest word, so no word is split); the wrapped
    columns then share what is left. `width` None: every column at its natural width."""
    shown = list(range(len(columns)))
    if width is None:
        return Fitted({i: natural[i] for i in shown}, [])

    def least(i: int) -> int:
        if not columns[i].wrap:
            return natural[i]
        return min(natural[i], max(MIN_WRAP_WIDTH, longest_word[i] if longest_word else 0))

    while table_width([least(i) for i in shown]) > width:
        droppable = [i for i in shown if columns[i].priority > 0]
        if not droppable:
            break
        shown.remove(max(droppable, key=lambda i: (columns[i].priority, i)))
    # A narrow column left out before a wide one of the same priority may fit again once that one is gone.
    for i in sorted(set(range(len(columns))) - set(shown), key=lambda i: (columns[i].priority, i)):
        if table_width([least(j) for j in (*shown, i)]) <= width:
            shown = sorted((*shown, i))
    widths = {i: least(i) for i in shown}
    spare = width - table_width(list(widths.values()))
    for i in (i for i in shown if columns[i].wrap):
        grow = max(min(natural[i] - widths[i], spare), 0)
        widths[i] += grow
        spare -= grow
    return Fitted(widths, [columns[i].header for i in range(len(columns)) if i not in widths])


def dropped_line(dropped: Sequence[str], width: Optional[int], hint: str) -> str:
    return f"{len(dropped)} column(s) left out to fit {width} columns: {', '.join(dropped)} ({hint})"


def print_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], title: str = "", wide: bool = False,
                hint: str = "--wide shows every column", width: Optional[int] = None,
                console: Any = None) -> List[str]:
    """Print the rows under the columns that fit the terminal (`width`, else terminal_width()); `wide`: every
    column at full width. A line names the columns left out and `hint` says how to see them. Returns the
    headers left out."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    texts = [[_text(cell) for cell in row] for row in rows]
    natural = [max([len(column.header)] + [row[i].cell_len for row in texts])
               for i, column in enumerate(columns)]
    limit = None if wide else (width if width is not None else terminal_width())
    longest_word = [max([len(word) for row in texts for word in row[i].plain.split()] or [0])
                    for i in range(len(columns))]
    fitted = fit_columns(columns, natural, limit, longest_word)
    fits = limit is None or table_width(list(fitted.widths.values())) <= limit
    table = Table(title=Text(title, style="table.title") if title else None, box=box.SIMPLE_HEAD,
                  show_edge=False)
    for i, cell_width in fitted.widths.items():
        # Where even the must-keep columns are wider than the terminal, rich narrows them and folds the
        # longest values onto more lines: a value is split, never cut.
        table.add_column(columns[i].header, justify=columns[i].justify, overflow="fold",
                         no_wrap=not columns[i].wrap and fits, width=cell_width if fits else None)
    for row in texts:
        table.add_row(*(row[i] for i in fitted.widths))
    shown_width = table_width(list(fitted.widths.values()))
    console = console or Console(width=limit or max(shown_width, len(title), 1), highlight=False)
    console.print(table)
    if fitted.dropped:
        console.print(Text(dropped_line(fitted.dropped, limit, hint)))
    return fitted.dropped
