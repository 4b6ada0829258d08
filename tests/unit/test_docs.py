"""The docs say what the code does: every flag of every command is in the CLI reference,
README stays short, and no relative link in README.md or docs/*.md points nowhere.

The help text comes from the real command (`python -m chload <cmd> --help` in a
subprocess), not from importing the CLI's modules: the layout of the package may change,
the command line is what users see.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CLI_REFERENCE = DOCS / "cli.md"
README_LIMIT = 8_000  # characters

_LONG_FLAG = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")
_SHORT_FLAG = re.compile(r"(?<![\w-])(-[a-zA-Z])(?![\w-])")
_COMMAND_LINE = re.compile(r"^ {4}([a-z][a-z0-9-]*) {2,}\S", re.MULTILINE)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


@cache
def _help(*command: str) -> str:
    done = subprocess.run([sys.executable, "-m", "chload", *command, "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, f"chload {' '.join(command)} --help failed: {done.stderr}"
    return done.stdout


def _commands() -> list[str]:
    """The subcommands `chload --help` lists (one indented line each: name, then help)."""
    text = _help()
    listed = text.split("positional arguments:", 1)[-1].split("options:", 1)[0]
    names = _COMMAND_LINE.findall(listed)
    assert names, f"no command found in chload --help:\n{text}"
    return names


def _flags(help_text: str) -> set[str]:
    """Every option the help text shows (long and short), but --help and -h."""
    options = help_text.split("options:", 1)[-1] if "options:" in help_text else help_text
    usage = help_text.split("\n\n", 1)[0]
    found = set()
    for part in (usage, options):
        found |= set(_LONG_FLAG.findall(part)) | set(_SHORT_FLAG.findall(part))
    return found - {"--help", "-h"}


def _docs_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md")))


def _section(text: str, command: str) -> str:
    """The part of the CLI reference about one command: from its `## chload <command>`
    heading to the next second-level heading."""
    match = re.search(rf"^## `?chload {re.escape(command)}\b.*?$(.*?)(?=^## |\Z)", text,
                      re.MULTILINE | re.DOTALL)
    assert match, f"docs/cli.md has no '## chload {command}' section"
    return match.group(1)


def _mentioned(flag: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def test_the_help_lists_the_commands_and_their_flags() -> None:
    """Guards the two tests below against passing on an empty listing."""
    commands = _commands()
    assert "load" in commands
    assert "--max-errors" in _flags(_help("load"))


@pytest.mark.parametrize("command", [""] + ["load", "files", "sql", "history", "errors",
                                            "validate", "run"])
def test_every_flag_is_in_the_docs(command: str) -> None:
    docs = _docs_text()
    flags = _flags(_help(*([command] if command else [])))
    missing = sorted(f for f in flags if not _mentioned(f, docs))
    assert not missing, f"chload {command} --help shows {missing}; document them in docs/"


def test_every_command_has_its_flags_in_the_cli_reference() -> None:
    """Each command's own section of docs/cli.md names each of its flags (a flag that
    docs/sources-kafka.md mentions is not documented for `chload files`)."""
    reference = CLI_REFERENCE.read_text(encoding="utf-8")
    gaps = {}
    for command in _commands():
        section = _section(reference, command)
        missing = sorted(f for f in _flags(_help(command)) if not _mentioned(f, section))
        if missing:
            gaps[command] = missing
    top = sorted(f for f in _flags(_help()) if not _mentioned(f, reference))
    if top:
        gaps["(chload)"] = top
    assert not gaps, f"docs/cli.md lacks these flags, by command: {gaps}"


def test_the_readme_is_short() -> None:
    size = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert size < README_LIMIT, f"README.md is {size} characters; keep it under {README_LIMIT}"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/test" in readme and "scripts/demo" in readme
    assert "scripts/test" in ci


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped,
    spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    anchors = set()
    for heading in _HEADING.findall(text):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(page: Path) -> None:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for link in _LINK.findall(text) + _IMAGE.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link, re.IGNORECASE):  # http:, mailto: ...
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link} (no such heading in {target.name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"
