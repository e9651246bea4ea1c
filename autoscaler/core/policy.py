"""Cost policies as typed, validated values. Pure: the YAML loader lives in `autoscaler.config`."""

from __future__ import annotations

import fnmatch
import re
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from croniter import croniter
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from autoscaler.core.model import CapacityType, Job

_NUMBER = r"\d+(?:\.\d+)?"
# one or more number+unit parts, largest first as people write them: 90s, 1h30m, 1d12h, 1.5h
_PARTS = re.compile(rf"^(?:{_NUMBER}(?:ms|s|m|h|d))+$")
_PART = re.compile(rf"({_NUMBER})(ms|s|m|h|d)")
# ISO 8601 durations without years and months (their length varies): PT1H30M, P1DT12H, PT90S
_ISO = re.compile(rf"^P(?:({_NUMBER})D)?(?:T(?:({_NUMBER})H)?(?:({_NUMBER})M)?(?:({_NUMBER})S)?)?$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration_pattern() -> str:
    """Every text `parse_duration` takes, as one pattern in the syntax Python's `re` and Go's
    RE2 share: the chart's values.schema.json holds it as is (autoscaler/config/helm_schema.py),
    so `helm install` refuses what the daemon would. ASCII: digits 0-9, ISO 8601's letters in
    either case, spaces between a number and its unit and between parts, whitespace around."""
    number, sp = r"[0-9]+(?:\.[0-9]+)?", " *"
    parts = rf"{number}{sp}(?:ms|[smhd])(?:{sp}{number}{sp}(?:ms|[smhd]))*"

    def iso(letter: str) -> str:
        return rf"{number}{sp}[{letter}{letter.lower()}]"

    hms = [iso("H"), iso("M"), iso("S")]
    # at least one of hours, minutes, seconds, in that order
    time = "|".join(
        "".join([hms[i], *(rf"(?:{sp}{later})?" for later in hms[i + 1 :])]) for i in range(3)
    )
    iso8601 = rf"[Pp]{sp}(?:{iso('D')}(?:{sp}[Tt]{sp}(?:{time}))?|[Tt]{sp}(?:{time}))"
    ws = r"[ \t\n\r\f\v]*"
    return rf"^{ws}(?:{number}|{parts}|{iso8601}){ws}$"


DURATION_PATTERN = _duration_pattern()


def parse_duration(value: Any) -> Any:
    """Accept `90` (seconds), `90s`, `5m`, `1.5h`, `1h30m`, `2d`, ISO 8601 `PT1H30M` (or a
    timedelta) as a duration."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    try:
        if isinstance(value, int | float):
            return timedelta(seconds=value)
        if isinstance(value, str) and re.fullmatch(DURATION_PATTERN, value):
            seconds = _seconds(value.strip().replace(" ", ""))
            if seconds is not None:
                return timedelta(seconds=seconds)
    except (OverflowError, ValueError):  # beyond timedelta's ~2.7 million years, or NaN
        raise ValueError(f"duration out of range: {value!r}") from None
    raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h30m or PT1H30M)")


def _seconds(text: str) -> float | None:
    if re.fullmatch(_NUMBER, text):
        return float(text)
    if _PARTS.match(text):
        return sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(text))
    iso = _ISO.match(text.upper())
    if iso and any(iso.groups()) and not text.upper().endswith("T"):  # not P, PT or P1DT
        days, hours, minutes, secs = (float(g or 0) for g in iso.groups())
        return days * 86400 + hours * 3600 + minutes * 60 + secs
    return None


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
Price = Annotated[float, Field(ge=0)]
Workers = Annotated[int, Field(ge=0)]


def _cron_pattern() -> str:
    """The 5-field cron a window's `schedule` may be, as one pattern (Python's `re` and Go's
    RE2 alike; the chart's values.schema.json holds it): per field `*`, a number in the field's
    range or (month, day of week) a name, a range `a-b`, a step `/n` after `*`, a number or a
    range, and comma lists. croniter's extensions (`L`, `W`, `#`, `?`, `H`) are refused."""
    months = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"
    fields = [
        "[0-5]?[0-9]",  # minute
        "[01]?[0-9]|2[0-3]",  # hour
        "0?[1-9]|[12][0-9]|3[01]",  # day of month
        f"0?[1-9]|1[0-2]|(?i:{months})",  # month
        "0?[0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)",  # day of week (0 and 7: Sunday)
    ]
    step = "/0*[1-9][0-9]*"

    def field(value: str) -> str:
        item = rf"(?:\*|(?:{value})(?:-(?:{value}))?)(?:{step})?"
        return rf"{item}(?:,{item})*"

    return "^[ \t]*" + "[ \t]+".join(field(v) for v in fields) + "[ \t]*$"


CRON_PATTERN = _cron_pattern()
Cron = Annotated[str, WithJsonSchema({"type": "string", "pattern": CRON_PATTERN})]


# A job (TrainingJob label) can name its policy outright.
POLICY_LABEL = "spot-autoscaler.io/policy"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Quantum(StrictModel):
    """Which worker counts a scale-out may land on (Volcano #4666 asks for powers of two)."""

    # `any`, `power_of_two`, or `multiple_of` (with `n`); YAML also takes `quantum: power_of_two`
    # and `quantum: {multiple_of: 4}`
    mode: Literal["any", "power_of_two", "multiple_of"] = "any"
    n: Annotated[int, Field(ge=1)] = 1  # the step of `multiple_of`

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, value: Any) -> Any:
        # YAML shorthands: `any`, `power_of_two`, `{multiple_of: 4}`
        if isinstance(value, str):
            return {"mode": value}
        if isinstance(value, dict) and set(value) == {"multiple_of"}:
            return {"mode": "multiple_of", "n": value["multiple_of"]}
        return value

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The shorthands too: a mode's name, or `{multiple_of: n}`."""
        full = handler(schema)
        fields = handler.resolve_ref_schema(full)["properties"]
        multiple_of = {
            "type": "object",
            "properties": {"multiple_of": fields["n"]},
            "required": ["multiple_of"],
            "additionalProperties": False,
        }
        return {"anyOf": [fields["mode"], multiple_of, full]}

    def allows(self, workers: int) -> bool:
        if self.mode == "power_of_two":
            return workers > 0 and workers & (workers - 1) == 0
        if self.mode == "multiple_of":
            return workers % self.n == 0
        return True

    def next_above(self, workers: int) -> int:
        """Smallest allowed count greater than `workers`."""
        if self.mode == "power_of_two":
            return 1 if workers < 1 else 1 << workers.bit_length()
        if self.mode == "multiple_of":
            return (workers // self.n + 1) * self.n
        return workers + 1


class Match(StrictModel):
    """Which jobs a policy governs. Empty = every job. Names are globs on `ns/name` or `name`."""

    names: list[str] = []  # globs on `ns/name` or `name`, e.g. `ml/bert-*`; empty: any
    namespaces: list[str] = []  # exact namespaces; empty: any
    labels: dict[str, str] = {}  # every one must equal the job's label of that key

    def selects(self, job: Job) -> bool:
        if self.namespaces and job.namespace not in self.namespaces:
            return False
        if self.names and not any(
            fnmatch.fnmatchcase(job.key, pat) or fnmatch.fnmatchcase(job.name, pat)
            for pat in self.names
        ):
            return False
        return all(job.labels.get(k) == v for k, v in self.labels.items())

    @property
    def everything(self) -> bool:
        """Empty: selects every job (a default policy's match, not a rule to try first)."""
        return not (self.names or self.namespaces or self.labels)


class ScaleOutRules(StrictModel):
    """When and how the job grows onto idle GPU capacity."""

    enabled: bool = True  # false: the job never grows (departures and min still apply)
    min_idle: Duration = timedelta(seconds=60)  # capacity must stay idle this long first
    # since the job's last finished scale-out: every scale-out costs each worker a reset, so
    # growth is batched; a forced scale-in does not restart it. 2m measured best on Bamboo traces
    cooldown: Duration = timedelta(minutes=2)
    # ScaleOut spec.timeout: pods must run by then. 6m: a GPU node's provisioning (2-5 min, the
    # slow end) and the pod's start, for workers past idle capacity; a refill below min that
    # fails can still be retried within Horovod's elastic timeout: 6m + 2m + a pod's start (1m)
    # < 10m (check-config warns otherwise)
    timeout: Duration = timedelta(minutes=6)
    backoff: Duration = timedelta(minutes=2)  # after a failed / rolled-back ScaleOut
    max_step: Annotated[int, Field(ge=1)] | None = None  # most workers added in one scaler
    # idle capacity of these node types may take new workers
    capacity_types: list[CapacityType] = [CapacityType.SPOT, CapacityType.ON_DEMAND]
    quantum: Quantum = Quantum()
    # ACK shared-GPU nodes (ack.node.gpu.schedule=share, GPU memory instead of whole GPUs) take
    # new workers only when true: a worker there shares its GPU with other pods
    shared_gpu: bool = False


class PreemptionRules(StrictModel):
    # avoid: no new workers on a node with a rebalance recommendation; drain: also leave it now
    rebalance: Literal["avoid", "drain"] = "avoid"
    # Karpenter's voluntary disruption (consolidation, drift). protect: the job's running workers
    # carry karpenter.sh/do-not-disrupt, so Karpenter does not pick their nodes; a node it
    # disrupts anyway gets no new workers and its workers stay until it is deleted (then it is
    # an interruption). drain: no annotation; a node Karpenter disrupts is drained at once, like
    # a notice (reason karpenter_disruption). docs/kubernetes.md, "Karpenter's voluntary disruption"
    voluntary: Literal["protect", "drain"] = "protect"
    # a scheduled maintenance counts as a hard notice once its deadline is this close
    maintenance_horizon: Duration = timedelta(minutes=10)
    # Horovod stops a job when no host of the previous set remains: keep one while we refill
    keep_last_host: bool = True
    # without the launcher's report (spot-autoscaler.io/assigned-hosts) a replacement counts as a
    # surviving host only this long after it is ready (a join takes ~5-7 s plus start-up)
    join_grace: Duration = timedelta(seconds=30)
    # with a report that says since when (standalone's owned_hosts.sh), a replacement counts as
    # a surviving host once it has been in Horovod's rank assignment this long: its join
    # (process start, imports, hvd.init, the state's broadcast) is over. A removal announced
    # during that join's reset is dropped (horovod/common/elastic.py run_fn: on_reset empties
    # the queue), so the kept host would then die in the ring. 15 s = the overlay script's
    # SPOT_SETTLE_SECONDS
    assigned_settle: Duration = timedelta(seconds=15)
    # the kept host leaves anyway once its node's deadline is this close, if a replacement is in
    # the rank assignment at all: never worse than keeping it (core/departures.py); it covers a
    # discovery call (~1.35 s), the next commit and a reset
    release_margin: Duration = timedelta(seconds=10)


class ScalerRules(StrictModel):
    # et-operator has no deadline for a ScaleIn (it waits on the launcher's `ps` output forever)
    # nor for the exec steps of a ScaleOut: past this age a scaler is reported stuck (a Warning
    # Event, a metric, a decision line); docs/kubernetes.md says how to recover
    max_age: Duration = timedelta(minutes=15)


class CostRules(StrictModel):
    # nodes above it get no new workers; a node without a price (unknown instance type and no
    # default in `prices`) counts as above it
    max_price_per_gpu_hour: Price | None = None
    budget_per_hour: Price | None = None  # this job's spend cap


class HorovodRules(StrictModel):
    """What the job's Horovod does on its own: the autoscaler must act within it."""

    # HOROVOD_ELASTIC_TIMEOUT / horovodrun --elastic-timeout (default 600 s, horovod/runner/
    # elastic/driver.py ElasticDriver.wait_for_available_slots): how long a job may stay below
    # --min-np before Horovod stops it. check-config warns when a failed refill could not be
    # retried within it: scale_out.timeout + scale_out.backoff + a pod's start (1m) >
    # elastic_timeout.
    elastic_timeout: Duration = timedelta(seconds=600)


class Limits(StrictModel):
    """Narrow a job's own min/max (et-operator does not enforce them; we do)."""

    min_workers: Workers | None = None  # raises the job's own min (null: the job's)
    max_workers: Workers | None = None  # lowers the job's own max (null: the job's)

    @model_validator(mode="after")
    def _ordered(self) -> Limits:
        if (
            self.min_workers is not None
            and self.max_workers is not None
            and self.min_workers > self.max_workers
        ):
            raise ValueError(f"min_workers {self.min_workers} > max_workers {self.max_workers}")
        return self


class OnDemandRules(StrictModel):
    """Workers the job may run on non-preemptible capacity. The daemon buys nothing: it scales
    out beyond idle spot capacity, the pods go Pending, and the cluster's node autoscaler
    (Karpenter, cluster-autoscaler, ACK/CCE node pools) provisions on-demand nodes for them."""

    # the anchor: kept on on-demand capacity while the job runs (unless spot is calm, below), so
    # that a spot wipe-out never takes every host (Horovod cannot survive losing its whole
    # previous host set)
    min_on_demand: Workers = 0
    # with a deadline, when the anchor is held: `at_risk`, only while the deadline's slack is
    # below one whole-job restart (a wipe-out would then cost the deadline; otherwise the anchor
    # costs more than the restart it saves); `always`, while the job runs. Without a deadline
    # the anchor is always held
    anchor: Literal["always", "at_risk"] = "at_risk"
    # the cap on on-demand workers, whatever the deadline says (None: up to max workers)
    max_on_demand: Workers | None = None
    # the anchor leaves while spot is calm: at least `calm_spot_workers` of the job's spot
    # workers have each run this long (None: the anchor stays while the job runs). A wave of
    # notices or a fresh set of spot workers brings it back.
    calm_after: Duration | None = None
    calm_spot_workers: Annotated[int, Field(ge=1)] = 4  # how many spot workers `calm_after` needs

    @model_validator(mode="after")
    def _ordered(self) -> OnDemandRules:
        if self.max_on_demand is not None and self.min_on_demand > self.max_on_demand:
            raise ValueError(
                f"min_on_demand ({self.min_on_demand}) exceeds max_on_demand ({self.max_on_demand})"
            )
        return self


class DeadlineRules(StrictModel):
    """Finish by a time, as cheaply as spot allows: spot whenever it is there, on-demand only
    when the deadline is at risk (docs/deadlines.md; core/deadline.py)."""

    at: datetime | None = None  # an absolute deadline (with a time zone)
    within: Duration | None = None  # or: this long after the job was created
    # finish this much before the deadline: covers node provisioning, pod start-up, Horovod's
    # reset and the error of the progress estimate
    margin: Duration = timedelta(minutes=30)
    # both pace the job's committed progress on the straight line from its start to `deadline -
    # margin`, with a safety net: every allowed worker once the time left is below what the
    # on-demand cap needs (at a lower bound of its speed) plus two changeovers d̂.
    # uniform_progress (Can't Be Late's rule, the baseline): behind the line, fill to max with
    # on-demand; once ahead of the line 2 d̂ on, on-demand leaves only for spot. paced: behind
    # the line, only the on-demand workers that catch up with it; let go once ahead
    rule: Literal["paced", "uniform_progress"] = "uniform_progress"
    # the least a changeover d̂ is taken to cost (node provisioning, pod start-up, Horovod's
    # reset, the training since the last commit): the job's own history raises it
    changeover: Duration = timedelta(minutes=5)
    # what a whole-job restart costs (back to the last checkpoint, and start again); the job's
    # own restarts raise it. The anchor (`at_risk`) is held while the deadline's slack is below
    restart: Duration = timedelta(minutes=30)
    # until a ring size has run, a ring of n is taken to do (n/m) ** scaling of what m measured
    # workers did (0.5: 41% more per doubling, below what data-parallel jobs reach)
    scaling: Annotated[float, Field(gt=0, le=1)] = 0.5

    @field_validator("at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("give the deadline a time zone, e.g. 2026-12-01T18:00:00Z")
        return value

    @model_validator(mode="after")
    def _one(self) -> DeadlineRules:
        if (self.at is None) == (self.within is None):
            raise ValueError("set exactly one of deadline.at and deadline.within")
        return self

    def due(self, started_at: datetime | None) -> datetime | None:
        """When the job must be done; None while a relative deadline's start is unknown."""
        if self.at is not None:
            return self.at
        assert self.within is not None
        return None if started_at is None else started_at + self.within


class Window(StrictModel):
    """Overrides in force for `duration` after each time the cron `schedule` fires."""

    name: str  # for the decision log
    schedule: Cron  # 5-field cron, evaluated in UTC
    duration: Duration  # how long the overrides last after each firing
    limits: Limits | None = None  # replaces the policy's limits meanwhile
    max_price_per_gpu_hour: Price | None = None  # replaces cost.max_price_per_gpu_hour meanwhile
    budget_per_hour: Price | None = None  # replaces cost.budget_per_hour meanwhile
    scale_out: bool | None = None  # false freezes growth during the window

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        # strict: a day no month in the field has (`0 0 31 2 *`) never fires, and `active`
        # would raise (croniter finds no previous firing)
        if not re.fullmatch(CRON_PATTERN, value) or not croniter.is_valid(value, strict=True):
            raise ValueError(f"not a 5-field cron expression: {value!r}")
        return value

    def active(self, now: datetime) -> bool:
        # The latest firing at or before `now` (croniter's prev is strict, so step from +1 s).
        last = croniter(self.schedule, now + timedelta(seconds=1)).get_prev(datetime)
        return last <= now < last + self.duration


class Policy(StrictModel):
    """One named set of rules; a job follows exactly one."""

    name: str  # what `spot-autoscaler.io/policy` and `default_policy` refer to
    match: Match = Match()
    priority: int | None = None  # overrides the job's own priority when set
    limits: Limits = Limits()
    scale_out: ScaleOutRules = ScaleOutRules()
    preemption: PreemptionRules = PreemptionRules()
    scalers: ScalerRules = ScalerRules()
    cost: CostRules = CostRules()
    horovod: HorovodRules = HorovodRules()
    on_demand: OnDemandRules = OnDemandRules()
    deadline: DeadlineRules | None = None
    windows: list[Window] = []

    def at(self, now: datetime) -> Policy:
        """This policy with the overrides of every window active at `now` (later ones win)."""
        policy = self
        for window in self.windows:
            if not window.active(now):
                continue
            cost = policy.cost.model_copy(
                update={
                    k: v
                    for k, v in (
                        ("max_price_per_gpu_hour", window.max_price_per_gpu_hour),
                        ("budget_per_hour", window.budget_per_hour),
                    )
                    if v is not None
                }
            )
            update: dict[str, Any] = {"cost": cost}
            if window.limits is not None:
                update["limits"] = policy.limits.model_copy(
                    update=window.limits.model_dump(exclude_none=True)
                )
            if window.scale_out is not None:
                update["scale_out"] = policy.scale_out.model_copy(
                    update={"enabled": window.scale_out}
                )
            policy = policy.model_copy(update=update)
        return policy

    @model_validator(mode="after")
    def _scaler_age(self) -> Policy:
        if self.scalers.max_age <= self.scale_out.timeout:
            raise ValueError(
                f"scalers.max_age ({self.scalers.max_age}) must exceed scale_out.timeout"
                f" ({self.scale_out.timeout}): a ScaleOut waiting for its pods is not stuck"
            )
        return self

    def bounds(self, job: Job) -> tuple[int, int]:
        """Effective (min, max) workers: the job's spec narrowed by this policy. Min wins a tie."""
        lo = max(job.min_workers, self.limits.min_workers or 0)
        hi = job.max_workers
        if self.limits.max_workers is not None:
            hi = min(hi, self.limits.max_workers)
        return lo, max(lo, hi)


def naming_problems(names: list[Any], default_policy: Any) -> list[tuple[str, str]]:
    """Cross-policy checks as (key, message), shared with the YAML loader (which runs them even
    when a field already failed, so every problem is reported at once)."""
    problems = []
    dupes = sorted({str(n) for n in names if names.count(n) > 1})
    if dupes:
        problems.append(("policies", f"duplicate policy names: {', '.join(dupes)}"))
    if default_policy is not None and default_policy not in names:
        problems.append(("default_policy", f"{default_policy!r} is not a defined policy"))
    return problems


class PolicySet(StrictModel):
    """Every named policy, how jobs pick one, and cluster-wide caps."""

    policies: list[Policy] = [Policy(name="default")]
    # used for jobs no policy matches; None leaves such jobs alone
    default_policy: str | None = "default"
    # USD per hour all managed jobs' running workers may cost together (null: no cap)
    cluster_budget_per_hour: Price | None = None

    @model_validator(mode="after")
    def _names(self) -> PolicySet:
        problems = naming_problems([p.name for p in self.policies], self.default_policy)
        if problems:
            raise ValueError("; ".join(f"{key}: {message}" for key, message in problems))
        return self

    def for_job(self, job: Job) -> Policy | None:
        """The policy pinned by the job's label, else the first that matches, else the default.
        Called for every job on every pass: no model is built here."""
        pinned = job.labels.get(POLICY_LABEL)
        for policy in self.policies if pinned is not None else ():
            if policy.name == pinned:
                return policy
        for policy in self.policies:
            if not policy.match.everything and policy.match.selects(job):
                return policy
        for policy in self.policies if self.default_policy else ():
            if policy.name == self.default_policy:
                return policy
        return None

    def unknown_pin(self, job: Job) -> str | None:
        """The job's policy label when it names no policy (a typo): `for_job` fell back."""
        pinned = job.labels.get(POLICY_LABEL)
        if pinned is None or any(p.name == pinned for p in self.policies):
            return None
        return pinned
