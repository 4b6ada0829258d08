"""Writers of the suite's three outputs: results.json (a list of result objects, what
scripts read back), results.md (tables for people) and results.png (rows/s per method,
one panel per dataset and format), plus machine.json (where and how it ran)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

COLOURS = {"chload": "#d9480f", "embedded": "#4c6ef5", "server": "#868e96"}


def write_json(path: str, results: list[dict]) -> None:
    with open(path, "w") as fh:
        json.dump(results, fh, indent=1)
        fh.write("\n")


def _cases(results: list[dict]) -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], None] = {}
    for r in results:
        seen[(r["dataset"], r["format"])] = None
    return list(seen)


def _fmt(value: object, spec: str = ",.0f", empty: str = "") -> str:
    return empty if value is None else format(value, spec)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _human(rows_per_s: float) -> str:
    return f"{rows_per_s / 1e6:.2f}M" if rows_per_s >= 1e6 else f"{rows_per_s / 1e3:.0f}k"


def _ratio(r: dict) -> str:
    if r["ratio_vs_chload"] is None:
        return "" if r["chload"] else "n/a"
    return "baseline" if r["chload"] else f"{r['ratio_vs_chload']:.2f}x"


def markdown(results: list[dict], machine: dict) -> str:
    lines = [
        f"# chload benchmark results ({machine['profile']} run)", "",
        f"{machine['date']} on {machine['cpu_model']}, {machine['cores']} cores, "
        f"{machine['memory_gib']} GiB RAM, disk {machine['disk']}; chDB {machine['chdb']}, "
        f"ClickHouse server {machine['server_version']}; chload {machine['chload_commit']}. "
        f"Repeats {machine['repeats']} (median shown) after {machine['warmup']} warm-up "
        f"round(s), methods alternating; load average at start {machine['loadavg_start']}.",
        "",
        "*vs chload* = the method's time / the time of chload on the same target and data "
        "(chload --audit for methods that add audit columns): **above 1x, chload is faster; "
        "below 1x, the method beats chload.** CPU % is machine-wide (all cores, neighbours "
        "included); *proc CPU s* is the method's own process tree, *server CPU s* the "
        "ClickHouse server's; disk util and await are for the device holding the data.",
        "",
    ]
    lines += summary(results)
    lines += costs(results)
    lines += versus(results)
    for dataset, fmt in _cases(results):
        rows = [r for r in results if (r["dataset"], r["format"]) == (dataset, fmt)]
        first = rows[0]
        lines += [f"## {dataset} {fmt}: {first['rows']:,} rows in {first['files']} files, "
                  f"{first['bytes'] / 1e6:,.1f} MB", "",
                  "| method | target | mode | seconds | rows/s | MB/s | vs chload | CPU % "
                  "| proc CPU s | server CPU s | disk util % | await ms |",
                  "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
        measured = sorted((r for r in rows if r["seconds"]), key=lambda r: -r["rows_per_s"])
        for r in measured:
            name = f"**{_cell(r['method'])}**" if r["chload"] else _cell(r["method"])
            lines.append(
                f"| {name} | {r['target']} | {r['mode']} | {r['seconds']:.2f} | "
                f"{r['rows_per_s']:,} | {r['mb_per_s']:.1f} | {_ratio(r)} | "
                f"{_fmt(r['cpu_util_pct'], '.0f')} | {_fmt(r['process_cpu_s'], '.1f')} | "
                f"{_fmt(r['server_cpu_s'], '.1f')} | {_fmt(r['disk_util_pct'], '.0f')} | "
                f"{_fmt(r['disk_await_ms'], '.2f')} |")
        for r in rows:
            if not r["seconds"]:
                lines.append(f"| {_cell(r['method'])} | {r['target']} | {r['mode']} | "
                             f"{r['status']} | | | | | | | | |")
        notes = [r for r in rows if r["status"] != "ok" and r["note"]]
        lines.append("")
        lines += [f"- {r['method']} [{r['target']}]: {r['status']}: {r['note']}"
                  for r in notes]
        if notes:
            lines.append("")
    lines += ["## Methods", ""]
    described: dict[str, str] = {}
    for r in results:
        described.setdefault(f"{r['method']} [{r['target']}]", r["about"])
    lines += [f"- **{key}**: {about}" for key, about in described.items()]
    return "\n".join(lines) + "\n"


def summary(results: list[dict]) -> list[str]:
    """Per dataset and target: chload against the fastest other method (same audit
    columns or none)."""
    lines = ["## Summary: chload against the fastest other method on the same target", "",
             "*vs chload's rows*: the method's whole time / the span in which chload's rows "
             "moved (its first data byte to the end of its last data request, chload's own "
             "report): at or above 1x, chload moves the rows as fast as the method, and what "
             "separates the two is chload's fixed cost (start, and the commit after the "
             "rows; the costs table below).", "",
             "| data | target | chload rows/s | fastest other method | its rows/s | vs chload "
             "| vs chload's rows |",
             "|---|---|--:|---|--:|--:|--:|"]
    for r in results:
        if not (r["chload"] and r["seconds"]):
            continue
        rivals = [o for o in results if o["seconds"] and not o["chload"]
                  and not o["method"].startswith("chload @")
                  and (o["target"], o["dataset"], o["format"], o["audit"])
                  == (r["target"], r["dataset"], r["format"], r["audit"])]
        if not rivals:
            continue
        best = max(rivals, key=lambda o: o["rows_per_s"])
        lines.append(f"| {r['dataset']} {r['format']} | {r['target']} | "
                     f"{_cell(r['method'])}: {r['rows_per_s']:,} | {_cell(best['method'])} | "
                     f"{best['rows_per_s']:,} | {best['ratio_vs_chload']:.2f}x | "
                     f"{_rows_ratio(best, r)} |")
    return [*lines, ""]


def _rows_ratio(other: dict, chload: dict) -> str:
    """`other`'s whole time over the span of chload's data requests (median of its runs)."""
    span = (chload.get("costs") or {}).get("data_s")
    return f"{other['seconds'] / span:.2f}x" if span else ""


def costs(results: list[dict]) -> list[str]:
    """chload's fixed and per-unit costs, from its own report (`--json`, LoadReport.costs;
    medians over the measured runs): what a short load pays that a long one amortizes."""
    rows = [r for r in results if r["chload"] and r.get("costs")]
    if not rows:
        return []
    lines = ["## chload's fixed and per-unit costs (its own report, median of the runs)", "",
             "*first byte*: seconds from the process's start to the first data byte sent; "
             "*rows s*: from then to the end of the last data request; *beyond rows s*: the "
             "run's whole time less *rows s* (start, and the commit tail after the rows: "
             "the fixed cost); *setup requests*: requests to the target before the first "
             "byte; per committed unit (a stage: one file or a batch of small ones), the "
             "requests other than data and their seconds.", "",
             "| data | target | method | first byte s | rows s | beyond rows s "
             "| setup requests | units | files | requests / unit | ms / unit |",
             "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        c = r["costs"]
        per_unit = c.get("commit_seconds_per_unit")
        lines.append(
            f"| {r['dataset']} {r['format']} | {r['target']} | {_cell(r['method'])} | "
            f"{_fmt(c.get('first_byte_s'), '.3f')} | {_fmt(c.get('data_s'), '.3f')} | "
            f"{_fmt(c.get('beyond_data_s'), '.3f')} | {_fmt(c.get('setup_requests'), '.0f')} | "
            f"{_fmt(c.get('units'), '.0f')} | {_fmt(c.get('files'), '.0f')} | "
            f"{_fmt(c.get('commit_requests_per_unit'), '.1f')} | "
            f"{_fmt(None if per_unit is None else per_unit * 1000, '.1f')} |")
    return [*lines, ""]


def versus(results: list[dict]) -> list[str]:
    """scripts/bench --chload-vs REV: the measured chload against REV's, per case."""
    other = [r for r in results if r["method"].startswith("chload @") and r.get("ratio_vs_chload")]
    if not other:
        return []
    lines = ["## A/B: this chload against another commit (same run, alternating)", "",
             "| data | target | method | its s | chload s | its s / chload s |",
             "|---|---|---|--:|--:|--:|"]
    for r in other:
        lines.append(f"| {r['dataset']} {r['format']} | {r['target']} | {_cell(r['method'])} | "
                     f"{r['seconds']:.3f} | {r['seconds'] / r['ratio_vs_chload']:.3f} | "
                     f"{r['ratio_vs_chload']:.2f}x |")
    return [*lines, ""]


def write_markdown(path: str, results: list[dict], machine: dict) -> None:
    with open(path, "w") as fh:
        fh.write(markdown(results, machine))


def write_chart(path: str, results: list[dict], title: str) -> None:
    """Horizontal bars of rows/s, one panel per case; chload's bars in orange."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = _cases(results)
    cols = 2 if len(cases) > 1 else 1
    nrows = -(-len(cases) // cols)
    heights = [len(list(_panel(results, c))) for c in cases]
    fig, axes = plt.subplots(nrows, cols, squeeze=False,
                             figsize=(8 * cols, max(3.0, 0.32 * max(heights) + 1.2) * nrows))
    for ax, case in zip(axes.flat, cases, strict=False):
        bars = list(_panel(results, case))
        labels = [f"{r['method']} [{r['target']}]" for r in bars]
        values = [r["rows_per_s"] / 1e6 if r["rows_per_s"] else 0 for r in bars]
        colours = [COLOURS["chload" if r["chload"] else r["target"]] for r in bars]
        ax.barh(range(len(bars)), values, color=colours)
        ax.set_yticks(range(len(bars)), labels, fontsize=8)
        ax.invert_yaxis()
        for i, r in enumerate(bars):
            text = f" {_human(r['rows_per_s'])}" if r["rows_per_s"] else f" {r['status']}"
            ax.text(values[i], i, text, va="center", fontsize=7)
        first = bars[0] if bars else {"rows": 0}
        ax.set_title(f"{case[0]} {case[1]} ({first['rows']:,} rows)", fontsize=10)
        ax.set_xlabel("million rows/s (higher is better)", fontsize=8)
        ax.margins(x=0.18)
    for ax in list(axes.flat)[len(cases):]:
        ax.set_visible(False)
    from matplotlib.patches import Patch

    legend = [Patch(color=COLOURS["chload"], label="chload"),
              Patch(color=COLOURS["embedded"], label="other, into embedded chDB"),
              Patch(color=COLOURS["server"], label="other, into the 18.16 server")]
    fig.legend(handles=legend, loc="upper right", fontsize=8)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(results: list[dict], case: tuple[str, str]) -> Iterable[dict]:
    rows = [r for r in results if (r["dataset"], r["format"]) == case]
    return sorted(rows, key=lambda r: -(r["rows_per_s"] or 0))


def write_all(out: str, results: list[dict], machine: dict) -> list[str]:
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, n) for n in
             ("results.json", "results.md", "results.png", "machine.json")]
    write_json(paths[0], results)
    write_markdown(paths[1], results, machine)
    write_chart(paths[2], results, f"chload benchmark ({machine['profile']}): "
                f"{machine['cores']} cores, {machine['date']}")
    with open(paths[3], "w") as fh:
        json.dump(machine, fh, indent=1)
        fh.write("\n")
    return paths
