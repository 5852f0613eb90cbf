"""A timeline as a table file, in the format its name gives: Parquet (``*.parquet``) or CSV (``*.csv``,
``*.csv.gz``).

Parquet is there for analysis: a reader gets the timeline's DataFrame back as it was, with its dtypes (categorical
streams, kinds and names, 32-bit ints) and without parsing text, from a file several times smaller than the CSV
(dictionary-encoded, compressed columns). pyarrow writes it; it is optional, so it is imported only when a Parquet
file is asked for, and :func:`check_table` says how to install it before any simulation runs.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from distsim.io.output import STDOUT, OutputError, check_output, open_output

FORMATS = {".parquet": "parquet", ".csv": "csv", ".csv.gz": "csv"}
"""Accepted name endings -> format."""
PYARROW_HINT = "pip install pyarrow"


def table_format(path: str | Path, option: str = "--table") -> str:
    """'parquet' or 'csv' from the file name; any other name is an OutputError naming the accepted endings."""
    name = str(path).lower()
    for suffix, fmt in FORMATS.items():
        if name.endswith(suffix):
            return fmt
    accepted = ", ".join(f"*{suffix}" for suffix in FORMATS)
    if str(path) == STDOUT:
        raise OutputError(f"{option} -: a table goes to a file named {accepted} (CSV on standard output: --csv -)")
    raise OutputError(f"{option} {path}: cannot tell the table format from the name; use {accepted}")


def check_table(path: str | Path | None, option: str = "--table") -> None:
    """Refuse now, in one line, a table that could not be written later: an unknown format, Parquet without pyarrow,
    or a path :func:`~distsim.io.output.check_output` refuses."""
    if path is None or str(path) == "":
        return
    if table_format(path, option) == "parquet":
        _pyarrow(option)
    check_output(path, option)


def _pyarrow(option: str) -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise OutputError(f"{option}: writing Parquet needs pyarrow: {PYARROW_HINT}") from None
    return pyarrow


def timeline_frame(timeline: Any, expand: bool = False) -> Any:
    """The timeline's DataFrame; `expand`: every GPU's rows (the expanded timeline, built in memory)."""
    return (timeline.expand() if expand else timeline).df


def write_parquet(path: str | Path, df: Any) -> Path:
    """A DataFrame as Parquet, dtypes kept (pandas' metadata in the file restores categoricals on reading)."""
    pa = _pyarrow("Parquet")
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)

    def write(fh: Any) -> None:
        if fh.seekable():
            pq.write_table(table, fh, compression="zstd")
            return
        buffer = io.BytesIO()  # a pipe or standard output: Parquet's writer wants to know where it is
        pq.write_table(table, buffer, compression="zstd")
        fh.write(buffer.getbuffer())

    with open_output(path, binary=True) as fh:
        write(fh)
    return Path(path)


def write_table(path: str | Path, timeline: Any, expand: bool = False) -> Path:
    """Write a timeline (every GPU's rows with `expand`) in the format the name gives; CSV as ``--csv`` writes it."""
    if table_format(path) == "csv":
        from distsim.io.files import write_timeline_csv

        return write_timeline_csv(path, timeline, expand=expand)
    return write_parquet(path, timeline_frame(timeline, expand))
