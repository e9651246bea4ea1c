"""bench.json, bench.md and bench.png from one benchmark run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoscaler.bench.result import PolicyResult
from autoscaler.bench.runner import Bench
from autoscaler.bench.world import time_mean
from autoscaler.sim.plot import steps

WORK_UNIT = "single-worker hours: one worker training alone for an hour does 1.0"
_RATIOS = ("cost_usd", "work_done", "cost_per_work", "completion_hours")


def summary(bench: Bench) -> dict[str, Any]:
    world = bench.world
    metrics = {name: _metrics(r, world.end, world.deadline) for name, r in bench.results.items()}
    oracle = metrics["oracle"]
    policies = {}
    for name, m in metrics.items():
        ratios = {k: _ratio(m[k], oracle[k]) for k in _RATIOS}
        policies[name] = {k: _round(v) for k, v in m.items()} | {"vs_oracle": ratios}
    return {
        "trace": world.trace_name,
        "trace_hours": round(world.end / 3600, 3),
        "spot_nodes": {
            "max": max(n for _, n in world.available),
            "mean": round(world.mean_available, 3),
            "removals": sum(1 for e in world.trace if e.kind == "remove"),
        },
        "seed": world.seed,
        "deadline_hours": None if world.deadline is None else round(world.deadline / 3600, 3),
        "instance": world.instance.model_dump(mode="json"),
        "jobs": [
            {
                "name": j.spec.name,
                "max_workers": j.max_workers,
                "static_workers": j.static_workers,
                "work_target": round(j.target, 3),
            }
            for j in world.jobs
        ],
        "work_unit": WORK_UNIT,
        "params": bench.params.model_dump(mode="json"),
        "policies": policies,
        "targets": targets(metrics),
        "wall_seconds": round(bench.wall_seconds, 3),
    }


def _metrics(r: PolicyResult, end: float, deadline: float | None) -> dict[str, Any]:
    completion = r.completion
    met = None if deadline is None else completion is not None and completion <= deadline
    work = r.work_done
    return {
        "cost_usd": r.cost_usd,
        "work_done": work,
        "cost_per_work": r.cost_usd / work if work > 0 else None,
        "completion_hours": completion / 3600 if completion is not None else None,
        "cost_to_target_usd": r.cost_at(completion) if completion is not None else None,
        "met_deadline": met,
        "rolled_back_work": sum(p.rolled_back for p in r.jobs),
        "resets": sum(p.resets for p in r.jobs),
        "graceful_removals": sum(p.graceful_removals for p in r.jobs),
        "abrupt_failures": sum(p.abrupt_failures for p in r.jobs),
        "restarts": r.restarts,
        "restarts_after_completion": r.restarts_after,
        "mean_workers": time_mean(r.workers, end),
        "actuation_errors": r.actuation_errors,
        "deadline_setup": {job: setup.as_dict() for job, setup in r.setups.items()} or None,
    }


def targets(metrics: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The issue's targets for `autoscaler` (lower is better for both cost per work and time)."""
    ours, oracle = metrics["autoscaler"], metrics["oracle"]

    def beats(other: str) -> dict[str, Any]:
        them = metrics[other]
        return {
            "cost_per_work": _ratio(ours["cost_per_work"], them["cost_per_work"]),
            "completion_hours": _ratio(ours["completion_hours"], them["completion_hours"]),
            "target": "both < 1",
            "met": _less(ours["cost_per_work"], them["cost_per_work"])
            and _less(ours["completion_hours"], them["completion_hours"]),
        }

    cpw = _ratio(ours["cost_per_work"], oracle["cost_per_work"])
    done = _ratio(ours["completion_hours"], oracle["completion_hours"])
    saving = _ratio(metrics["on_demand_only"]["cost_per_work"], ours["cost_per_work"])
    return {
        "cost_per_work_vs_oracle": {"value": cpw, "target": "<= 1.10", "met": _le(cpw, 1.10)},
        "completion_vs_oracle": {"value": done, "target": "<= 1.10", "met": _le(done, 1.10)},
        "cheaper_than_on_demand_only": {
            "value": saving,
            "target": ">= 2",
            "met": _le(2.0, saving),
        },
        "better_than_reactive_elastic": beats("reactive_elastic"),
        "better_than_spot_static_restart": beats("spot_static_restart"),
    }


def _less(a: float | None, b: float | None) -> bool:
    """a < b, where None (never finished, no work) is worse than any number."""
    return a is not None and (b is None or a < b)


def _le(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and a <= b


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def _round(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


def markdown(s: dict[str, Any]) -> str:
    nodes = s["spot_nodes"]
    head = (
        f"# Benchmark: `{Path(s['trace']).name}`\n\n"
        f"{s['trace_hours']} h, {s['instance']['name']} spot nodes: up to {nodes['max']}, mean "
        f"{nodes['mean']}, {nodes['removals']} removals; seed {s['seed']}. "
        f"Work in {s['work_unit']}. "
        "Completion: time to the work target "
        + ", ".join(f"{j['name']} {j['work_target']}" for j in s["jobs"])
        + " (max workers on-demand for "
        + f"{s['params']['jobs'][0]['target_on_demand_hours']} h); "
        "cost and work: over the whole trace.\n\n"
        "| policy | cost $ | work | $/work | $/work ×oracle | completion h | ×oracle "
        "| $ to target | rolled back | resets | graceful | abrupt | restarts | mean workers |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for name, p in s["policies"].items():
        r = p["vs_oracle"]
        rows.append(
            f"| {name} | {p['cost_usd']:.2f} | {p['work_done']:.1f} | {_fmt(p['cost_per_work'])} "
            f"| {_fmt(r['cost_per_work'], 3)} | {_fmt(p['completion_hours'], 2)} "
            f"| {_fmt(r['completion_hours'], 3)} | {_fmt(p['cost_to_target_usd'], 2)} "
            f"| {p['rolled_back_work']:.2f} | {p['resets']} "
            f"| {p['graceful_removals']} | {p['abrupt_failures']} | {p['restarts']} "
            f"| {p['mean_workers']:.1f} |"
        )
    checks = [
        f"- {name}: {_target_value(t)} (target {t['target']}): {'met' if t['met'] else 'NOT met'}"
        for name, t in s["targets"].items()
    ]
    return (
        head
        + "\n".join(rows)
        + _deadline(s)
        + "\n\nTargets for `autoscaler`:\n\n"
        + "\n".join(checks)
        + "\n"
    )


def _deadline(s: dict[str, Any]) -> str:
    """Which policies finished by the deadline, and what getting there cost them."""
    if s["deadline_hours"] is None:
        return ""
    met = [
        f"{name} (${p['cost_to_target_usd']:.2f} to target, {p['completion_hours']:.2f} h)"
        for name, p in s["policies"].items()
        if p["met_deadline"]
    ]
    missed = [name for name, p in s["policies"].items() if not p["met_deadline"]]
    ran = [
        f"{name} ran `{d['rule']}` with anchor {_anchor(d)} (policy {d['policy']}"
        + ("" if d["max_on_demand"] is None else f", max_on_demand {d['max_on_demand']}")
        + (f", job {job})" if len(setup) > 1 else ")")
        for name, p in s["policies"].items()
        for setup in [p["deadline_setup"] or {}]
        for job, d in setup.items()
    ]
    return (
        f"\n\nDeadline {s['deadline_hours']:g} h after the start: met by "
        + (", ".join(met) or "none")
        + "; missed by "
        + (", ".join(missed) or "none")
        + ". "
        + "; ".join(ran)
        + ". Restarts: whole-job restarts until the job was done; after it (no cost to the job): "
        + ", ".join(f"{n} {p['restarts_after_completion']}" for n, p in s["policies"].items())
        + "."
    )


def _anchor(setup: dict[str, Any]) -> str:
    held = setup["anchor"]
    return f"{held['min_on_demand']} ({held['held']})" if held["min_on_demand"] else "none"


def _target_value(t: dict[str, Any]) -> str:
    if "value" in t:
        return _fmt(t["value"], 3)
    return f"$/work {_fmt(t['cost_per_work'], 3)}, completion {_fmt(t['completion_hours'], 3)}"


def _fmt(v: float | None, digits: int = 4) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def plot(bench: Bench, path: Path) -> None:
    """Available spot nodes, workers per policy, work done (with the target and the deadline) and
    cumulative cost, against hours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    world = bench.world
    fig, (nodes, workers, work, cost) = plt.subplots(4, 1, sharex=True, figsize=(10, 12))
    t, n = steps(world.available, world.end)
    nodes.step(t, n, where="post", color="black")
    nodes.set_ylabel("spot nodes up")
    for name, r in bench.results.items():
        t, n = steps(r.workers, world.end)
        workers.step(t, n, where="post", label=name, linewidth=1)
        done = [*r.work_over_time(), (world.end, r.work_done)]  # flat after the last change
        work.plot([p[0] / 3600 for p in done], [p[1] for p in done], label=name, linewidth=1)
        cost.plot([p[0] / 3600 for p in r.cost], [p[1] for p in r.cost], label=name)
    workers.set_ylabel("running workers")
    workers.legend(loc="lower right", fontsize="small")
    work.axhline(sum(j.target for j in world.jobs), color="grey", linestyle="--", label="target")
    if world.deadline is not None:
        for panel in (work, cost):
            panel.axvline(world.deadline / 3600, color="red", linestyle=":", label="deadline")
    work.set_ylabel("work done (single-worker h)")
    work.legend(loc="upper left", fontsize="small")
    cost.set_ylabel("cumulative cost $")
    cost.set_xlabel("hours")
    cost.set_xlim(0, world.end / 3600)
    fig.suptitle(Path(world.trace_name).name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
