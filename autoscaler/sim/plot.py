"""simulate's picture, drawn from summary.json alone: spot nodes up, workers per job against
their min and max, notices, and cumulative cost, against hours (matplotlib, an extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def steps(series: list[tuple[float, int]] | list[list[float]], end: float) -> tuple[list, list]:
    """A step series of (seconds, value) change points, extended to `end`, in hours."""
    points = [*series, (end, series[-1][1])] if series else [(0.0, 0), (end, 0)]
    return [p[0] / 3600 for p in points], [p[1] for p in points]


def plot_summary(summary: dict[str, Any], path: Path) -> None:
    """Raises ImportError without matplotlib (the caller says so and carries on)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = summary["duration_hours"] * 3600
    fig, (nodes, workers, cost) = plt.subplots(3, 1, sharex=True, figsize=(10, 9))
    nodes.step(*steps(summary["spot_nodes_over_time"], end), where="post", color="black")
    for t in summary["notices_at"]:
        nodes.axvline(t / 3600, color="red", alpha=0.25, linewidth=0.8)
    nodes.set_ylabel("spot nodes up\n(red: notices)")
    for key, job in summary["jobs"].items():
        line = workers.step(*steps(job["workers_over_time"], end), where="post", label=key)
        color = line[0].get_color()
        for bound in ("min_workers", "max_workers"):
            workers.axhline(job[bound], color=color, linestyle=":", linewidth=0.8)
    workers.set_ylabel("running workers\n(dotted: min, max)")
    workers.legend(loc="lower right", fontsize="small")
    spent = summary["cost_over_time"]
    cost.plot([t / 3600 for t, _ in spent], [c for _, c in spent], label="autoscaler")
    cost.axhline(
        summary["on_demand_cost_usd"],
        color="grey",
        linestyle="--",
        label="on-demand total, same GPU-hours",
    )
    cost.set_ylabel("cumulative cost $")
    cost.set_xlabel("hours")
    cost.set_xlim(0, end / 3600)
    cost.legend(loc="center left", fontsize="small")
    fig.suptitle(str(summary["trace"]))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
