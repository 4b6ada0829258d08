"""Local files: paths, directories and globs (`*`, `?`, `**`, `{a,b}`, `{1..10}`), and stdin.

Invariants (docs/sources-files.md, "Local files", is the user's side):
- a file is known by its resolved location (`realpath`): every spelling of it in one
  command is one file, loaded once; a name that exists is taken literally;
- walks follow symlinked directories but enter each once (device, inode), and skip hidden
  names, what is not a regular file, and every chload target directory (`.chload.lock`);
- the engine's file() expands `*`, `?` and `{}` with no escape (chDB 4.4), so a real name
  holding one, or bytes not UTF-8, reaches it as a plain-named symlink in a temporary
  directory; the uri stays the real path (non-UTF-8 bytes written `\\xNN`);
- `release()` removes such links and stdin's spool.
"""

from __future__ import annotations

import builtins
import functools
import glob
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import unquote

from chload.core.reading import sniff
from chload.errors import NothingMatched, SourceError
from chload.formats import LINE_FORMATS, FileFormat, detect, magic
from chload.runtime.engine import LOCK_NAME
from chload.schema import quote_str
from chload.sources.base import InPlace, KnownKeys, Skipped, SourceContext, SourceFile, revised
from chload.sources.files import walk
from chload.sources.files.made import LINKS_PREFIX, release, remember, spool_stdin
from chload.sources.files.patterns import brace_list, expand_braces, glob_regex

_PATTERN_CHARS = set("*?[{")
_ENGINE_GLOB = re.compile(r"[*?{}]")  # what the engine's file() expands in a path
_NOT_PLAIN = re.compile(r"[^A-Za-z0-9._-]")



def list_local(pattern: str, fmt: str | None, compression: str | None) -> list[SourceFile]:
    """Every regular file the pattern names, once each, sorted by uri: `stream_local`,
    held (a run streams it)."""
    files: dict[str, SourceFile] = {}
    try:
        for f in stream_local(pattern, fmt, compression):
            assert isinstance(f, SourceFile)  # (nothing Skipped: no known units given)
            if f.uri in files:
                release([f])
            else:
                files[f.uri] = f
    except BaseException:
        release(files.values())
        raise
    return sorted(files.values(), key=lambda f: f.uri)


def stream_local(pattern: str, fmt: str | None, compression: str | None,
                 known: KnownKeys | None = None) -> Iterator[SourceFile | Skipped]:
    """Every regular file the pattern names, as the walk finds them (in the order of
    their paths); a file reached by two spellings comes twice (the plan keeps it once).
    Each costs a stat: what only its bytes tell waits for `described`. With `known`
    (the units loaded into the run's table), walked files it holds unchanged come
    counted as `Skipped` (walk.py), where the compiled walk can be had."""
    listing = _Listing()
    lib = walk.library()[0] if known is not None else None
    found = 0
    for item in _find(pattern, lib):
        if isinstance(item, walk.Run):
            assert known is not None
            for f in _run_files(item, fmt, compression, listing, lib, known):
                found += f.count if isinstance(f, Skipped) else 1
                yield f
            continue
        file = _describe(*item, fmt, compression, listing)
        if file is not None:
            found += 1
            yield file
    if not found:
        raise NothingMatched(f"{display(pattern)}: no such file, or the pattern matches "
                             "nothing")


def _run_files(run: walk.Run, fmt: str | None, compression: str | None, listing: _Listing,
               lib: Any, known: KnownKeys) -> Iterator[SourceFile | Skipped]:
    """A run of one directory's walked files: those `known` holds unchanged counted,
    the others described one by one (all of them where a file's uri is not its
    directory's resolved path plus its name, in ASCII: walk.c compares only those)."""
    _, real, absolute, inside = listing.of(run.directory, run.real, run.absolute)
    if inside or not run.names:
        return
    prefix = real if real.endswith("/") else real + "/"
    codes = b""
    if not len(known) and absolute == real and prefix.isascii() and not _ENGINE_GLOB.search(
            prefix):
        yield from _first_files(lib, run, prefix, fmt, compression, listing)
        return
    if absolute == real and prefix.isascii():
        skipped, codes = walk.known(lib, run, run.names, prefix, known)
        if skipped:
            yield Skipped(skipped)
    at = codes.find(walk.ASK) if codes else 0  # (bytes.find: no Python step a skipped file)
    while 0 <= at < len(run.names):
        file = _describe(os.path.join(run.directory, run.names[at]), False, fmt,
                         compression, listing)
        yield from [file] if file is not None else []
        at = codes.find(walk.ASK, at + 1) if codes else at + 1


def _first_files(lib: Any, run: walk.Run, prefix: str, fmt: str | None,
                 compression: str | None, listing: _Listing) -> Iterator[SourceFile]:
    """A run of one directory's walked files where no unit is known yet: stat'ed, and
    the small ones read whole, in C (walk.described), each a SourceFile as `_describe`
    makes it (its uri and the engine's path are the directory's resolved path plus its
    name, every name that is not plain ASCII being left to `_describe`), its bytes kept
    for `described` and the header checks (sniff.keep_whole): no file opened again."""
    whole: list[tuple[SourceFile, bytes]] = []
    for name, code, size, mtime_ns, data in walk.described(lib, run, run.names,
                                                           sniff.keeping):
        if code == walk.FOUND:
            uri = prefix + name
            file = SourceFile(uri, size, mtime_ns, _format_of(_suffixes(name), fmt,
                                                                compression), local_path=uri)
            if data is not None:
                whole.append((file, data))
                if len(whole) >= walk.CHUNK:  # (a directory of a million files: kept as
                    sniff.keep_whole(whole)  # they come, not held to its end)
                    whole = []
            yield file
        elif code == walk.ASK:
            described_ = _describe(os.path.join(run.directory, name), False, fmt,
                                   compression, listing)
            yield from [described_] if described_ is not None else []
    sniff.keep_whole(whole)


def described(files: Sequence[SourceFile], compression: str | None) -> list[SourceFile]:
    """Text files whose names show no compression, with the one their first bytes show
    (a gzip export saved as `trips.csv`), unless --compression said it."""
    if compression not in (None, "auto"):
        return list(files)
    return [f if f.is_stream or not f.local_path else _as_stored(f) for f in files]


def _as_stored(f: SourceFile) -> SourceFile:
    if f.format.compression != "none" or f.format.name not in LINE_FORMATS:
        return f
    head = sniff.stored_start(f)  # (its start kept for the header check: one open a file)
    method = magic(head) if head else "none"
    return f if method == "none" else replace(f, format=replace(f.format, compression=method))


def display(path: str) -> str:
    """A path as text: bytes of the name that are not UTF-8 written `\\xNN`."""
    if path.isascii():
        return path
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _find(pattern: str, lib: Any = None) -> Iterator[tuple[str, bool] | walk.Run]:
    """(path, named explicitly) for what the pattern names; a path that exists is
    taken literally, glob characters and all. With the compiled walk (`lib`), what a
    walk finds comes as runs of a directory's names."""
    path = os.path.expanduser(_without_scheme(pattern))
    if os.path.lexists(path) or not _PATTERN_CHARS & set(path):
        yield from _named(path, lib)
        return
    for piece in expand_braces(path):
        if os.path.lexists(piece):
            yield from _named(piece, lib)
        elif _PATTERN_CHARS & set(piece):
            yield from _glob(piece, lib)


def _without_scheme(source: str) -> str:
    """`file:///a/b%20c.csv` (or `file://localhost/...`) -> `/a/b c.csv`."""
    if not source.startswith("file://"):
        return source
    path = source.removeprefix("file://")
    path = "/" + path.removeprefix("localhost/") if path.startswith("localhost/") else path
    return unquote(path) if "%" in path and not os.path.lexists(path) else path


def _named(path: str, lib: Any = None) -> Iterator[tuple[str, bool] | walk.Run]:
    if os.path.isdir(path):
        if _TargetDirs().holds(os.path.realpath(path)):
            raise SourceError(f"{display(path)}: a chload target directory (it holds "
                              f"{LOCK_NAME}); its files are never a source")
        if lib is not None:
            yield from walk.runs(lib, path)
        else:
            yield from ((p, False) for p in _walk(path))
    elif os.path.exists(path):
        yield path, True
    else:
        raise SourceError(f"{display(path)}: no such file or directory")


def _glob(pattern: str, lib: Any = None) -> Iterator[tuple[str, bool] | walk.Run]:
    """Python's glob, in the order of the paths and a directory at a time (`_expand`),
    but `**` walks with `_walk` (each directory once: loops end), or in runs of names
    with the compiled walk (`lib`)."""
    parts = pattern.split("/")
    if "**" not in parts:
        if lib is not None and _magic_at(parts) == len(parts) - 1:
            yield from _glob_run(_base(pattern, parts), parts[-1])
            return
        yield from ((p, False) for p in _expand(_base(pattern, parts), parts[_magic_at(parts):]))
        return
    cut = parts.index("**")
    base = "/".join(parts[:cut]) or ("/" if pattern.startswith("/") else ".")
    rest = [p for p in parts[cut:] if p]
    bases = (p[0] for p in _glob(base) if isinstance(p, tuple)) if _PATTERN_CHARS & set(
        base) else iter([base])
    matches = _matcher(tuple(rest))
    for directory in (b for b in bases if os.path.isdir(b)):
        cut = len(os.path.join(directory, ""))  # (the walk's paths begin so)
        if lib is None:
            yield from ((p, False) for p in _walk(directory) if matches(p[cut:]))
            continue
        keep = _names_filter(tuple(rest))
        for run in walk.runs(lib, directory):
            rel = os.path.join(run.directory, "")[cut:]
            run.names = keep(run.names) if keep else [
                n for n in run.names if matches(rel + n)]
            yield run


def _glob_run(directory: str, last: str) -> Iterator[walk.Run]:
    """What a pattern with wildcards in its last component only names (`dir/*.csv`), as
    `_expand` finds it, but as one run of the directory's matching names, sorted."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        names = sorted(n for n in os.listdir(fd) if _component(last, n))
        if names:
            yield walk.Run(directory, fd, names)
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=16)
def _matcher(pattern: tuple[str, ...]) -> Callable[[str], bool]:
    """`_match` of the pattern components against a relative path, as one regex when
    no component asks for hidden names (a walk never yields them)."""
    if any(p.startswith(".") for p in pattern):
        return lambda rel: _match(pattern, rel.split("/"))
    out = []
    for i, part in enumerate(pattern):
        last = i == len(pattern) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]*/)*")
        else:
            out.append(glob_regex(part) + ("" if last else "/"))
    regex = re.compile("".join(out), re.DOTALL)
    return lambda rel: regex.fullmatch(rel) is not None


@functools.lru_cache(maxsize=16)
def _names_filter(pattern: tuple[str, ...]) -> Callable[[list[str]], list[str]] | None:
    """For `**/NAME-PATTERN` (any directory, then a name), the names of a directory that
    match, tested by name alone (what `_matcher` asks of a path, without a path a name).
    None for other patterns."""
    if len(pattern) != 2 or pattern[0] != "**" or pattern[1].startswith("."):
        return None
    name = pattern[1]
    if name.startswith("*") and not _PATTERN_CHARS & set(name[1:]) and "]" not in name:
        return functools.partial(_ending, name[1:])
    match = re.compile(glob_regex(name), re.DOTALL).fullmatch
    return lambda names: list(filter(match, names))


def _ending(suffix: str, names: list[str]) -> list[str]:
    """The names ending with `suffix` (`*.csv`): when all do, the usual case, one count
    over the names joined says so, with no step a name in Python."""
    if ("\0".join(names) + "\0").count(suffix + "\0") == len(names):
        return names
    return [n for n in names if n.endswith(suffix)]


def _magic_at(parts: Sequence[str]) -> int:
    return next((i for i, p in enumerate(parts) if glob.has_magic(p)), len(parts))


def _base(pattern: str, parts: Sequence[str]) -> str:
    base = "/".join(parts[:_magic_at(parts)])
    return base or ("/" if pattern.startswith("/") else "")


def _expand(directory: str, rest: Sequence[str]) -> Iterator[str]:
    """The paths under `directory` that the pattern components `rest` match, as glob
    matches them (a wildcard skips hidden names), each directory's names sorted."""
    if not rest:
        yield directory
        return
    head, tail = rest[0], rest[1:]
    if not glob.has_magic(head):
        path = os.path.join(directory, head)
        if (os.path.isdir(path) if tail else os.path.lexists(path)) or not head:
            yield from _expand(path, tail)
        return
    try:
        names = sorted(n for n in os.listdir(directory or ".") if _component(head, n))
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        if not tail or os.path.isdir(path):
            yield from _expand(path, tail)


def _match(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Path components against pattern components; `**` is any number of them."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and _component(head, parts[0]) and _match(rest, parts[1:])


def _component(pattern: str, name: str) -> bool:
    if name.startswith(".") and not pattern.startswith("."):
        return False  # as glob: a wildcard does not match a hidden name
    return fnmatchcase(name, pattern)


def _walk(directory: str) -> Iterator[str]:
    """Every regular, non-hidden file under a directory, recursively, in the order of
    their paths (a directory's name sorts as `name/`), holding the names of the
    directories being walked, never the whole tree's. Symlinked directories are
    followed; each directory is entered once; chload targets never."""
    seen: set[tuple[int, int]] = set()

    def visit(root: str) -> Iterator[str]:
        try:
            st = os.stat(root)
            with os.scandir(root) as it:
                entries = [e for e in it if not e.name.startswith(".")
                           or e.name == LOCK_NAME]
        except OSError:
            return
        if (st.st_dev, st.st_ino) in seen or any(e.name == LOCK_NAME for e in entries):
            return
        seen.add((st.st_dev, st.st_ino))
        ordered = sorted((e.name + "/" if _is_dir(e) else e.name, e) for e in entries)
        for name, entry in ordered:
            if name.endswith("/"):
                yield from visit(entry.path)
            else:
                yield entry.path
    yield from visit(directory)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # (a symlinked directory too: walks follow them)
    except OSError:
        return False


class _TargetDirs:
    """Which directories are inside a chload target (a directory holding `.chload.lock`)."""

    def __init__(self) -> None:
        self._known: dict[str, bool] = {}

    def holds(self, directory: str) -> bool:
        if directory not in self._known:
            parent = os.path.dirname(directory)
            self._known[directory] = os.path.exists(os.path.join(directory, LOCK_NAME)) or (
                parent != directory and self.holds(parent))
        return self._known[directory]


class _Listing:
    """What one listing learns and makes: which directories are chload targets, the
    resolved and absolute spelling of the directory it is in, and symlinks with plain
    names, in one temporary directory made on first use."""

    def __init__(self) -> None:
        self.targets = _TargetDirs()
        self._directory = ""
        self._links = 0
        self._at = ("\0", "", "", False)  # a directory as walked (no path holds NUL;
        # "" is the working directory's), its realpath, its abspath, inside a target

    def of(self, head: str, real: str = "", absolute: str = "",
           ) -> tuple[str, str, str, bool]:
        """A directory as walked: (itself, its realpath, its abspath, inside a target);
        `real` and `absolute` where the walk found them already."""
        if self._at[0] != head:
            real = real or os.path.realpath(head or ".")
            self._at = (head, real, absolute or os.path.abspath(head or "."),
                        self.targets.holds(real))
        return self._at

    def resolve(self, path: str) -> tuple[str, os.stat_result, bool]:
        """(os.path.realpath(path), its stat, whether it is inside a chload target), its
        directory resolved once for all its files: one lstat a file not a link."""
        cut = path.rfind("/")
        head, name = path[:max(cut, 0)] if cut != 0 else "/", path[cut + 1:]
        if name in ("", ".", ".."):
            real = os.path.realpath(path)
            return real, os.stat(real), self.targets.holds(os.path.dirname(real))
        _, directory, _, inside = self.of(head)
        joined = directory + name if directory.endswith("/") else f"{directory}/{name}"
        st = os.lstat(joined)
        if not stat.S_ISLNK(st.st_mode):
            return joined, st, inside
        real = os.path.realpath(joined)
        return real, os.stat(real), self.targets.holds(os.path.dirname(real))

    def absolute(self, path: str) -> str:
        """os.path.abspath(path), its directory made absolute once for all its files."""
        cut = path.rfind("/")
        head, name = path[:max(cut, 0)] if cut != 0 else "/", path[cut + 1:]
        if name in ("", ".", ".."):
            return os.path.abspath(path)
        directory = self.of(head)[2]
        return directory + name if directory.endswith("/") else f"{directory}/{name}"

    def engine_path(self, real: str) -> str:
        """What the engine's file() can be given for `real`: itself, or a plain link."""
        if not _ENGINE_GLOB.search(real) and display(real) == real:
            return real
        if not self._directory:
            self._directory = tempfile.mkdtemp(prefix=LINKS_PREFIX)
        name = _NOT_PLAIN.sub("_", display(os.path.basename(real)))
        self._links += 1
        link = os.path.join(self._directory, f"{self._links}-{name}")
        os.symlink(real, link)
        remember(link)
        return link


def _describe(path: str, named: bool, fmt: str | None, compression: str | None,
              listing: _Listing) -> SourceFile | None:
    """The file at `path`, or None for one a walk or glob met that is no source:
    not a regular file, or inside a chload target. Named explicitly, those are errors."""
    try:
        real, st, inside = listing.resolve(path)
    except OSError as exc:
        if named:
            raise SourceError(f"{display(path)}: cannot read it ({exc.strerror})") from exc
        return None
    if not stat.S_ISREG(st.st_mode):
        if named:
            raise SourceError(f"{display(path)}: not a regular file; to load a pipe, "
                              "send it to standard input: ... | chload load - --format ...")
        return None
    if inside:
        if named:
            raise SourceError(f"{display(path)}: inside a chload target directory; a "
                              "target's own files are never a source")
        return None
    spelled = display(listing.absolute(path))  # the uri chload 0.1.0 recorded
    uri = display(real)
    return SourceFile(
        uri=uri, size=st.st_size, mtime_ns=st.st_mtime_ns,
        format=_format_of(_suffixes(path[path.rfind("/") + 1:]), fmt, compression),
        local_path=listing.engine_path(real), aliases=(spelled,) if spelled != uri else (),
    )


def _suffixes(name: str) -> str:
    """The end of a name that tells its format and compression (`.csv.gz`): every
    extension formats.py knows is one dot long."""
    last = name.rfind(".")
    if last < 0:
        return ""
    before = name.rfind(".", 0, last)
    return name[before if before >= 0 else last:]


@functools.lru_cache(maxsize=256)
def _format_of(suffixes: str, fmt: str | None, compression: str | None) -> FileFormat:
    return detect(display(suffixes), fmt, compression, strict=False)


def table_function(file: SourceFile, fmt: str, structure: str | None) -> str:
    """`file('path', 'Format', 'structure', 'compression')`."""
    args = [file.local_path or file.uri, fmt, structure or "auto", file.format.compression]
    return f"file({', '.join(quote_str(a) for a in args)})"


def table_function_many(files: Sequence[SourceFile], fmt: str,
                        structure: str | None) -> tuple[str, str] | None:
    """One file() over a `dir/{a,b/c}` list of the files: one query plan for the batch,
    cheaper than a UNION ALL of one file() each (docs/benchmarks.md). Each row's uri is
    the directory's plus `_file` when the files share one directory, else its `_path`
    (the engine reads a name with a `/` in the list as that path, without listing the
    tree). Files the engine reads through a link (glob characters in the name) are read
    one by one."""
    if any(f.is_stream or not f.local_path or f.local_path != f.uri for f in files):
        return None
    listed = brace_list(files)
    if listed is None:
        return None
    one = SourceFile(listed, 0, 0, files[0].format, local_path=listed)
    prefix = listed[:listed.index("{")]
    if "/" in listed[len(prefix):]:
        return table_function(one, fmt, structure), "_path"
    return table_function(one, fmt, structure), f"concat({quote_str(prefix)}, _file)"


class LocalSource(InPlace):
    """Paths, directories, globs and `file://` on this machine, and `-` (standard input,
    spooled): read by the engine's file(). The one kind whose identity can be taken
    again at the read (a stat) and whose presence is known without reading."""

    kind = "local"
    schemes: tuple[str, ...] = ("file",)
    options: tuple[str, ...] = ("follow", "poll")
    grows = True  # a file may still be written when listed: following waits (core/follow.py)

    def list(self, pattern: str, context: SourceContext) -> Iterator[SourceFile | Skipped]:
        if pattern == "-":
            return iter([spool_stdin(context.format, context.compression, context.workdir)])
        return stream_local(pattern, context.format, context.compression, context.known)

    def described(self, files: Sequence[SourceFile],
                  context: SourceContext) -> builtins.list[SourceFile]:
        return described(files, context.compression)

    def table_function(self, file: SourceFile, fmt: str, structure: str | None) -> str:
        return table_function(file, fmt, structure)

    def table_function_many(self, files: Sequence[SourceFile], fmt: str,
                            structure: str | None) -> tuple[str, str] | None:
        return table_function_many(files, fmt, structure)

    def release(self, files: Iterable[SourceFile]) -> None:
        release(files)

    def current(self, file: SourceFile) -> SourceFile:
        """The file's size and mtime as they are now (stdin's spool: as spooled)."""
        return next(self.current_many((file,)))

    def current_many(self, files: Sequence[SourceFile]) -> Iterator[SourceFile]:
        """`current` of each file, in one loop (a batch of many small files asks twice a
        file), each asked as it is taken."""
        stat_of = os.stat
        for file in files:
            if file.is_stream or not file.local_path:
                yield file
                continue
            try:
                st = stat_of(file.local_path)
            except OSError as exc:
                raise SourceError(f"{file.uri}: cannot read it ({exc.strerror}); it was "
                                  "there when listed") from exc
            # (unchanged: the same object, no copy)
            yield (file if st.st_size == file.size and st.st_mtime_ns == file.mtime_ns else
                   revised(file, size=st.st_size, mtime_ns=st.st_mtime_ns))

    def still_there(self, file: SourceFile) -> bool | None:
        if file.is_stream or not file.local_path:
            return None
        return os.path.isfile(file.local_path) and os.access(file.local_path, os.R_OK)

    def reads_at_uri(self, file: SourceFile) -> bool:
        return file.local_path == file.uri  # not stdin's spool, nor a plain-named link

    def known_empty(self, file: SourceFile) -> bool:
        return file.size == 0


SOURCE = LocalSource()
