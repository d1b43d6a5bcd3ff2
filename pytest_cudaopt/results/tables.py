"""Fixed-width and Markdown tables of rows (dicts of text), kept within TABLE_WIDTH columns on a terminal: the one table renderer of every command."""

from __future__ import annotations

import textwrap
from typing import Iterable, Mapping, Sequence


def render_rows(rows: Sequence[Mapping[str, str]], *, title: str = "", notes: Iterable[str] = (),
                fmt: str = "table") -> str:
    """Rows (dicts, in column order) as a fixed-width or Markdown table, with title and notes."""
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    notes = list(notes)
    if fmt == "markdown":
        out = [f"### {title}", ""] if title else []
        if columns:
            out.append("| " + " | ".join(columns) + " |")
            out.append("|" + "|".join("---" if i == 0 else "---:" if _numeric(cells, i) else "---"
                                      for i in range(len(columns))) + "|")
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in line) + " |" for line in cells]
        if notes:
            out += [""] + [f"- {n}" for n in notes]
        return "\n".join(out)
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}; expected 'table' or 'markdown'")
    widths = _fitted(columns, cells)

    def lines(values: Sequence[str]) -> list[str]:
        # A cell wider than its column wraps onto the next lines, the other cells left blank there.
        wrapped = [textwrap.wrap(v, w, break_on_hyphens=False) or [""] if len(v) > w else [v]
                   for v, w in zip(values, widths)]
        return ["  ".join((parts[k] if k < len(parts) else "").rjust(w) if _numeric(cells, i)
                          else (parts[k] if k < len(parts) else "").ljust(w)
                          for i, (parts, w) in enumerate(zip(wrapped, widths))).rstrip()
                for k in range(max(len(p) for p in wrapped))]

    out = [title] if title else []
    if columns:
        out += [*lines(columns), "  ".join("-" * w for w in widths), *[x for c in cells for x in lines(c)]]
    out += notes
    return "\n".join(out)


TABLE_WIDTH = 120   # a terminal table with a long text cell wraps to stay within this
LONG_CELL = 40      # a text cell wider than this (the drawn shapes' inputs and notes) is long


def _fitted(columns: Sequence[str], cells: Sequence[Sequence[str]], limit: int = TABLE_WIDTH,
            narrowest: int = 20) -> list[int]:
    """Column widths within `limit` characters where a text cell is longer than LONG_CELL: headers
    wrapped first, then the widest text column narrowed, none below `narrowest`."""
    def over() -> int:
        return sum(widths) + 2 * (len(widths) - 1) - limit

    values = [max([0] + [len(line[i]) for line in cells]) for i in range(len(columns))]
    widths = [max(len(c), v) for c, v in zip(columns, values)]
    text = [not _numeric(cells, i) for i in range(len(columns))]
    if over() <= 0 or not any(t and v > LONG_CELL for t, v in zip(text, values)):
        return widths   # short cells only: a table a few columns too wide stays as it is
    widths = [max(v, (len(c) + 1) // 2, *(len(word) for word in c.split())) for c, v in zip(columns, values)]
    while over() > 0:
        i = max((i for i in range(len(widths)) if text[i] and widths[i] > narrowest),
                key=lambda i: widths[i], default=None)
        if i is None:
            break
        widths[i] = max(narrowest, widths[i] - over())
    return widths


def _numeric(cells: Sequence[Sequence[str]], column: int) -> bool:
    """Right-align columns whose cells start with a digit (or are '-')."""
    values = [line[column] for line in cells if line[column] not in ("-", "")]
    return bool(values) and all(v[:1].isdigit() for v in values)
