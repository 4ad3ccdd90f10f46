"""A study's result as others read it: the CSV (one row per configuration, with its differences from Eagle-1),
the table printed at the end of a run, and the figures (PNG)."""

from __future__ import annotations

import csv
from pathlib import Path

CSV_COLUMNS = ("label", "method", "params", "draft", "images", "latency_images", "tau", "speedup_vs_ar",
               "log_likelihood_per_token", "fid", "judge_accuracy")
DIFFERENCES = ("tau", "speedup_vs_ar", "log_likelihood_per_token", "fid", "judge_accuracy")


def csv_rows(result: dict) -> list[dict]:
    """One row per configuration: its numbers, then each difference from Eagle-1 with its interval (blank where
    not measured: no judge, no Eagle-1)."""
    rows = []
    for run in result["runs"]:
        row = {key: run.get(key, "") for key in CSV_COLUMNS}
        row["params"] = ",".join(f"{key}={value}" for key, value in run["params"].items())
        for key in DIFFERENCES:
            difference = run.get("vs_eagle", {}).get(key, {})
            row.update({f"vs_eagle_{key}": difference.get("value", ""),
                        f"vs_eagle_{key}_low": difference.get("low", ""),
                        f"vs_eagle_{key}_high": difference.get("high", "")})
        rows.append(row)
    return rows


def write_csv(result: dict, path: Path) -> None:
    rows = csv_rows(result)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def format_table(result: dict) -> str:
    """A header line (model, device, threads, sample sizes) and one row per configuration."""
    threads = result["threads"]
    timed = result.get("latency_images", result["images"])
    timed_note = f" ({timed} timed)" if timed != result["images"] else ""
    lines = [(f"{result['model']} on {result['device']} ({result['dtype']}), {threads} torch thread"
              f"{'s' if threads != 1 else ''}, {result['images']} images x {len(result['runs'])} configurations"
              f"{timed_note}, {result['repeats']} timing(s) each, draft {result['draft']}"),
             f"speed-ups over AR with the same {result.get('steps', 'eager')} steps (the AR baseline runs as every "
             "method does, in the same run)"]
    header = ["label", "tau", "fwd/img", "latency ms", "latency IQR ms", "speed-up", "speed-up range",
              "accept/fwd", "loglik/token", "judge acc", "fid"]
    rows = [header]
    for run in result["runs"]:
        low, high = run["latency_iqr_s"]
        rows.append([run["label"][:60], f"{run['tau']:.3f}", f"{run['target_forwards_per_image']:.1f}",
                     f"{1000 * run['latency_median_s']:.1f}", f"{1000 * low:.1f}-{1000 * high:.1f}",
                     f"{run['speedup_vs_ar']:.2f}x", speed_range(run),
                     f"{run['acceptance_vs_target_forward']:.3f}", f"{run['log_likelihood_per_token']:.4f}",
                     f"{run['judge_accuracy']:.3f}" if "judge_accuracy" in run else "",
                     f"{run['fid']:.2f}" if "fid" in run else ""])
    shown = [c for c in range(len(header)) if any(row[c] for row in rows[1:])]  # no judge: no quality columns
    widths = {c: max(len(row[c]) for row in rows) for c in shown}
    lines += ["  ".join(row[c].rjust(widths[c]) for c in shown) for row in rows]
    if any(row["batch"] != 1 for row in result.get("batches", [])):
        lines += ["", format_batches(result["batches"])]
    return "\n".join(lines)


def speed_range(row: dict) -> str:
    """A speed-up's bracket, the lowest and highest paired ratio (:func:`coolsd.core.stats.speedup_over_ar`);
    empty for a result written before it was recorded."""
    if "speedup_vs_ar_range" not in row:
        return ""
    low, high = row["speedup_vs_ar_range"]
    return f"{low:.2f}-{high:.2f}x"


def format_batches(rows: list[dict]) -> str:
    """The speed at each latency batch size, one row per (batch size, configuration)."""
    table = [["batch", "label", "images/s", "call ms", "speed-up vs AR", "speed-up range", "lockstep rounds"]]
    for row in rows:
        table.append([str(row["batch"]), row["label"][:60], f"{row['images_per_s']:.2f}",
                      f"{1000 * row['call_latency_median_s']:.1f}", f"{row['speedup_vs_ar']:.2f}x",
                      speed_range(row), f"{row['lockstep_rounds_over_own']:.2f}x"])
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in table)


def write_figures(result: dict, folder: Path) -> list[Path]:
    """The study's figures as PNG files in ``folder`` (matplotlib, imported only when asked for)."""
    from ..app.plots import study_figures
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, figure in study_figures(result).items():
        paths.append(folder / f"{stem}.png")
        figure.savefig(paths[-1], dpi=100)
    return paths
