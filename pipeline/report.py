"""The jobs' `report.html`: one self-contained page (plots embedded as PNG data URIs, no scripts)."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from matplotlib.figure import Figure
from pyspark.sql import Column
from pyspark.sql import functions as F

from plexmq.pipeline.inputs import FileAccount

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { padding: .2em .7em; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; }
.note { color: #666; }
"""


def utc(micros: int) -> datetime:
    """A UTC time from microseconds since the epoch (collecting Spark timestamps gives local time)."""
    return _EPOCH + timedelta(microseconds=micros)


def text_time(column: str) -> Column:
    """A timestamp column as UTC text for a report table."""
    return F.date_format(column, "yyyy-MM-dd HH:mm:ss").alias(column)


def tenant(name: str) -> str:
    """A tenant as a report shows it: its name, or "(default)" for the default tenant ("")."""
    return name or "(default)"


def figure(width: float = 10, height: float = 3.6) -> Figure:
    """A new figure (no pyplot: no global state, no display needed)."""
    return Figure(figsize=(width, height), layout="constrained")


def image(fig: Figure) -> str:
    """The figure as an embedded PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="plot">'


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """An HTML table with numbers and times formatted for reading."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return html.escape(str(value))


def write(path: Path, title: str, sections: Sequence[tuple[str, str]]) -> None:
    """Write the page: a title, then (heading, HTML) sections."""
    parts = [f"<h2>{html.escape(heading)}</h2>\n{body}" for heading, body in sections]
    page = (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>\n"
        + "\n".join(parts)
        + "\n</body></html>\n"
    )
    path.write_text(page, encoding="utf-8")


def files_section(accounts: Sequence[FileAccount], what: str) -> str:
    """What was read, and every damaged file with what was skipped of it."""
    damaged = [a for a in accounts if a.damage is not None]
    summary = table(
        [what, "bytes", "records read", "damaged", "bytes skipped"],
        [
            [
                len(accounts),
                sum(a.bytes for a in accounts),
                sum(a.records for a in accounts),
                len(damaged),
                sum(a.skipped_bytes for a in damaged),
            ]
        ],
    )
    if not damaged:
        return summary
    rows = [[a.path, a.damage, a.records, a.skipped_bytes] for a in damaged]
    return summary + table(["damaged file", "damage", "records kept", "bytes skipped"], rows)
