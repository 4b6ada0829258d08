"""How each file of a run is read, decided before any row loads: the CSV delimiter,
whether a CSV/TSV file starts with a header line, and how far the engine's schema
reader can read a file it stumbles on.

Only first lines are read here (sniff.py for a local file, one `LIMIT 1` engine read
for a remote one), and never from a pipe: a Kafka unit or a database range is read
once, by its load. Counting a file's lines (why inference failed) is the engine's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from itertools import chain, islice

from chload.core.reading import sniff
from chload.errors import ChloadError
from chload.formats import HEADER_FORMATS, JSON_LINES, FileFormat
from chload.schema import decide_header, header_columns
from chload.sources.base import SourceFile, revised
from chload.targets.base import Target


def resolve_format(target: Target, files: Sequence[SourceFile],
                   names: Sequence[str] = (), forced: bool = False,
                   delimiter: str | None = None) -> list[SourceFile]:
    """Decide the CSV delimiter once for the run (`_decide_delimiter`), then CSV/TSV
    headers once per format, for all its files (`_decide_header`).

    `names`: the columns the data may have (the table's, or --schema's), if known.
    `forced`: the user named the format (--format), which then stands as ClickHouse
    reads it: `CSV` has no header line, `CSVWithNames` has one.
    `delimiter`: the user's `format_csv_delimiter`, if set (then nothing is guessed).
    """
    given = {id(f.format): f.format for f in files}  # (a listing shares its format objects)
    csv = {k for k, fmt in given.items() if fmt.name.startswith("CSV")}
    sep = _decide_delimiter(target, (f for f in files if id(f.format) in csv), delimiter) \
        if csv else ""
    read = {k: _with_delimiter(fmt, sep) if k in csv else fmt for k, fmt in given.items()}
    decided: dict[FileFormat, FileFormat] = {}
    for fmt in dict.fromkeys(read.values()):
        decided[fmt] = fmt
        if not forced and fmt.name in HEADER_FORMATS:
            decided[fmt] = _decide_header(target, fmt, (
                _with_format(f, fmt) for f in files if read[id(f.format)] == fmt), names)
    final: dict[int, tuple[FileFormat | None, FileFormat | None]] = {}  # format -> what a
    for k, fmt in given.items():  # file of it, not empty and empty, becomes (None: itself)
        to = decided[read[k]]
        final[k] = (None if to == fmt else to, None if _headless(to) == fmt else _headless(to))
    return [f if (as_ := final[id(f.format)][f.empty]) is None else revised(f, format=as_)
            for f in files]


def _with_format(file: SourceFile, fmt: FileFormat) -> SourceFile:
    """`file` read as `fmt` (itself when it is already: a copy of each of many small
    files costs)."""
    return file if fmt == file.format else revised(file, format=fmt)


def _headless(fmt: FileFormat) -> FileFormat:
    """How a file known empty is read: without a header line, which it lacks (chDB reads
    an empty `CSVWithNames` file as a header of one unnamed column, "Unknown field found
    in format header: ''"); so it loads 0 rows and the ledger records it."""
    return replace(fmt, name=fmt.name.removesuffix("WithNames"))


def _decide_delimiter(target: Target, files: Iterable[SourceFile], given: str | None) -> str:
    """The run's CSV delimiter ('' for `,`): the user's, else `,` unless the first line
    of the first CSV file that has one splits only on `;`, a tab or `|`
    (sniff.guess_delimiter): a CSV saved with a European locale must not load as one
    column named `a;b;c`. One per run, as the engine takes it as one setting; a file
    written with another fails alone at the header check. `--setting
    format_csv_delimiter=,` keeps `,` for a one-column file whose first line has a `;`."""
    if given is not None:
        return "" if given == "," else given
    for sample in samples(files):
        text = _first_text(target, sample)
        if text is not None:
            return sniff.guess_delimiter(text) or ""
    return ""


@functools.lru_cache(maxsize=64)  # (once a format, not once a file of many)
def _with_delimiter(fmt: FileFormat, sep: str) -> FileFormat:
    """A CSV format read with `sep`: a tab makes it TSV (the engine's CSV reader cannot
    infer a tab-separated CSV: "Expected end of line")."""
    if sep == "\t":
        return replace(fmt, name=fmt.name.replace("CSV", "TSV", 1))
    return replace(fmt, delimiter=sep)


def csv_settings(files: Sequence[SourceFile],
                 given: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The setting a run's loads need for the delimiter resolve_format guessed (none
    when the user set it, or it is `,`)."""
    if any(name == "format_csv_delimiter" for name, _ in given):
        return ()
    sep = next((f.format.delimiter for f in files if f.format.delimiter), "")
    return (("format_csv_delimiter", sep),) if sep else ()


def _decide_header(target: Target, fmt: FileFormat, files: Iterable[SourceFile],
                   names: Sequence[str]) -> FileFormat:
    """Whether these CSV/TSV files start with a header line (README: Tables chload creates):

    1. a first line of just known names (`names`) is one, no engine needed;
    2. else the engine's detection: the first line's types differ from the rest's;
    3. else (every column text, or the engine could not tell) a first line that looks
       like names (sniff.looks_like_names) is one; into a table that exists, only when
       it names one of its columns. A text file without a header whose first line reads
       as names (`Paris,France`) is taken as having one: the table's columns show it,
       any other file of the run fails, naming `--format CSV`, which says "no header".

    A file that cannot tell (empty, corrupt) does not stop the run: the next one is
    asked, and if none can, files keep their format and fail or load on their own.
    """
    named = replace(fmt, name=HEADER_FORMATS[fmt.name])
    candidates = samples(files)
    first = first_line(target, candidates[0]) if candidates else None
    firsts = chain([first], (first_line(target, s) for s in candidates[1:]))
    if names and any(f and set(header_columns(f)) <= set(names) for f in firsts):
        return named  # any sample, not just the first: a garbage first file must not decide
    engine_said_no = False
    for sample in candidates:
        def reader(x: FileFormat, s: SourceFile = sample) -> str:
            return target.reader(s, x.name, None)
        try:
            if decide_header(target.infer_rows, reader, fmt) == named:
                return named
            engine_said_no = True
            break
        except ChloadError:
            continue
    if not first or not sniff.looks_like_names(first, unique=engine_said_no):
        return fmt
    return named if not names or set(first) & set(names) else fmt


def first_line(target: Target, file: SourceFile,
               start: Callable[[SourceFile, int], bytes | None] | None = None,
               ) -> list[str] | None:
    """The fields of a CSV/TSV file's first line: read here for a local file (sniff.py),
    or for a remote one whose source reads its start (`start`: RunSources.start, one
    ranged read, decompressed here), else by the engine (one `LIMIT 1` read); None when
    it has none or cannot be read."""
    fields = sniff.header_names(file)
    if fields is not None or sniff.delimiter(file.format) is None:
        return fields
    text = sniff.remote_first_text(file, start) if start is not None else None
    if text is None:
        text = _first_text(target, file, local=False)
    return sniff.split_line(text, file.format) if text is not None else None


def _first_text(target: Target, file: SourceFile, local: bool = True) -> str | None:
    """A file's first line: read here for a local file (sniff.first_text), else by the
    engine (one `LIMIT 1` read); None when it has none or cannot be read, or is a pipe
    (a Kafka unit, a database range): read once, by the load."""
    if not sniff.read_again(file):
        return None
    text = sniff.first_text(file) if local else None
    if text is not None:
        return text
    try:
        rows = target.infer_rows(f"SELECT line FROM {target.reader(file, 'LineAsString', None)}"
                                 " LIMIT 1")
    except ChloadError:
        return None
    return rows[0]["line"] if rows else None


def samples(files: Iterable[SourceFile], limit: int = 3) -> list[SourceFile]:
    """The files worth asking about a schema: the first few not known to be empty (a
    remote object of size 0 may just not have said its size: Source.known_empty)."""
    return list(islice((f for f in files if not f.empty), limit))


def rows_before_blank_tail(target: Target, file: SourceFile) -> int | None:
    """A CSV/TSV file ending in blank lines, with none before them: how many rows it has
    (one engine read of its lines, LineAsString); None for any other file."""
    if sniff.delimiter(file.format) is None:
        return None
    try:
        found = target.infer_rows(
            "SELECT count() AS lines, countIf(has) AS filled, maxIf(n, has) AS last FROM ("
            "SELECT rowNumberInAllBlocks() + 1 AS n, match(line, '\\S') AS has FROM "
            f"{target.reader(file, 'LineAsString', None)}) SETTINGS max_threads = 1")
    except ChloadError:
        return None
    if not found:
        return None
    lines, filled, last = (int(found[0][k]) for k in ("lines", "filled", "last"))
    rows = filled - (1 if file.format.has_header else 0)
    return rows if filled == last < lines and rows > 0 else None


def rows_before_bad_json(target: Target, file: SourceFile) -> int | None:
    """JSON lines with a line that is not JSON (`not json`, a cut-off object) among the
    first 25,000: how many lines come before the first; None for another file."""
    if file.format.name not in JSON_LINES:
        return None
    try:
        found = target.infer_rows(
            "SELECT minIf(n, NOT isValidJSON(line) AND match(line, '\\S')) AS bad FROM ("
            "SELECT rowNumberInAllBlocks() + 1 AS n, line FROM "
            f"{target.reader(file, 'LineAsString', None)} LIMIT 25000) "
            "SETTINGS max_threads = 1")
    except ChloadError:
        return None
    bad = int(found[0]["bad"]) if found else 0
    return bad - 1 if bad > 1 else None


def just_a_header(target: Target, file: SourceFile) -> bool:
    """True when the file's only line is its header (no rows to infer types from)."""
    lines = target.infer_rows(f"SELECT count() AS n FROM (SELECT line FROM "
                              f"{target.reader(file, 'LineAsString', None)} WHERE line != '' "
                              "LIMIT 2)")
    return bool(lines) and int(lines[0]["n"]) == 1
