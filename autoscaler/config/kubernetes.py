"""`kubernetes:` section: what the cluster observer watches and how it reads nodes and jobs."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any

from pydantic import Field, GetJsonSchemaHandler, field_validator, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from autoscaler.config.selectors import label_matcher
from autoscaler.core.model import CapacityType, NoticeKind
from autoscaler.core.policy import Duration, StrictModel


class CapacityRule(StrictModel):
    """One node label that says spot or on-demand. The first rule that matches a node wins.

    - `{label: L}`: the label's value names the type (`spot`, `on-demand`, `SPOT`, `ON_DEMAND`...).
    - `{label: L, equals: V, type: T}`: type T when the label's value is V.
    - `{label: L, not_equals: V, type: T}`: type T when the label is present with another value.
    """

    label: str  # the node label to read
    equals: str | None = None  # the rule holds when the label has this value
    not_equals: str | None = None  # the rule holds when the label is there with another value
    type: CapacityType | None = None  # what the node is then (without equals/not_equals: the value)

    @model_validator(mode="after")
    def _consistent(self) -> CapacityRule:
        if self.equals is not None and self.not_equals is not None:
            raise ValueError("give equals or not_equals, not both")
        if (self.equals is not None or self.not_equals is not None) and self.type is None:
            raise ValueError("a rule with equals/not_equals needs a type")
        return self

    def match(self, labels: dict[str, str]) -> CapacityType | None:
        value = labels.get(self.label)
        if value is None:
            return None
        if self.equals is not None:
            return self.type if value == self.equals else None
        if self.not_equals is not None:
            return self.type if value != self.not_equals else None
        normal = value.strip().lower().replace("_", "-")
        if normal in ("spot", "preemptible"):
            return CapacityType.SPOT
        if normal in ("on-demand", "ondemand", "normal"):
            return CapacityType.ON_DEMAND
        return None


def _default_capacity_rules() -> list[CapacityRule]:
    spot, on_demand = CapacityType.SPOT, CapacityType.ON_DEMAND
    return [
        CapacityRule(label="karpenter.sh/capacity-type"),
        CapacityRule(label="eks.amazonaws.com/capacityType"),  # SPOT | ON_DEMAND
        CapacityRule(label="node.alibabacloud.com/spot-strategy", equals="NoSpot", type=on_demand),
        CapacityRule(label="node.alibabacloud.com/spot-strategy", not_equals="NoSpot", type=spot),
        CapacityRule(label="cloud.google.com/gke-spot", equals="true", type=spot),
        CapacityRule(label="cloud.google.com/gke-preemptible", equals="true", type=spot),
        # AKS labels spot pools' nodes so (regular ones carry no such label: on-demand by
        # default); MicrosoftDocs/azure-aks-docs articles/aks/spot-node-pool.md
        CapacityRule(label="kubernetes.azure.com/scalesetpriority", equals="spot", type=spot),
    ]


_NTH = "aws-node-termination-handler"
# Taints other systems put on a node that is going away (or at risk): the notice they stand for.
DEFAULT_NOTICE_TAINTS: dict[str, NoticeKind] = {
    f"{_NTH}/spot-itn": NoticeKind.INTERRUPTION,
    f"{_NTH}/rebalance-recommendation": NoticeKind.REBALANCE,
    f"{_NTH}/scheduled-maintenance": NoticeKind.MAINTENANCE,
    f"{_NTH}/asg-lifecycle-termination": NoticeKind.INTERRUPTION,
    # Karpenter v1 (pkg/apis/v1/taints.go DisruptedTaintKey) and, before v1, v1beta1's
    # `karpenter.sh/disruption=disrupting` (pkg/apis/v1beta1/taints.go, e.g. v0.37.0)
    "karpenter.sh/disrupted": NoticeKind.INTERRUPTION,
    "karpenter.sh/disruption": NoticeKind.INTERRUPTION,
    "ToBeDeletedByClusterAutoscaler": NoticeKind.INTERRUPTION,
}


class SharedGpuSettings(StrictModel):
    """ACK shared-GPU nodes advertise GPU memory (GiB) instead of whole GPUs. Their capacity is
    counted in GPU equivalents: memory requested / (memory allocatable / GPU count)."""

    node_label: str = "ack.node.gpu.schedule"  # the node label that marks a sharing mode
    # ACK's GPU-sharing modes ("Enable scheduling features", ACK docs): cgpu (cGPU memory
    # isolation), core_mem (compute and memory isolated), share (no isolation), mps (NVIDIA MPS);
    # `default` (whole GPUs) and `topology` are not sharing
    node_label_values: list[str] = ["cgpu", "core_mem", "share", "mps"]
    memory_resource: str = "aliyun.com/gpu-mem"  # the extended resource of GPU memory (GiB)
    count_resource: str = "aliyun.com/gpu-count"  # the extended resource of physical GPUs

    @model_validator(mode="before")
    @classmethod
    def _single_value(cls, data: Any) -> Any:
        # `node_label_value: X` (one value, from before ACK had several sharing modes) still works
        if isinstance(data, dict) and "node_label_value" in data:
            if "node_label_values" in data:
                raise ValueError("give node_label_values, not also node_label_value")
            data = {**data, "node_label_values": [data["node_label_value"]]}
            del data["node_label_value"]
        return data

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """`node_label_value` too, never with `node_label_values`."""
        reference = handler(schema)
        full = handler.resolve_ref_schema(reference)
        full["properties"]["node_label_value"] = {"type": "string"}
        full["not"] = {"required": ["node_label_value", "node_label_values"]}
        return reference

    def shares(self, labels: Mapping[str, str]) -> bool:
        return labels.get(self.node_label) in self.node_label_values


class KubernetesSettings(StrictModel):
    # Namespaces whose TrainingJobs/AITrainingJobs (and scalers) are managed; empty = all.
    # Pods are always watched cluster-wide: idle GPUs depend on every pod on a node.
    namespaces: list[str] = []
    # Label selector (Kubernetes syntax) a job must match to be managed; "" = every job.
    label_selector: str = ""

    @field_validator("label_selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        label_matcher(value)  # raises ValueError with the bad term: check-config reports it
        return value

    # Extended resources that count as GPUs, in node allocatable and pod requests.
    gpu_resources: list[str] = ["nvidia.com/gpu"]
    # None turns shared-GPU (GPU memory) accounting off.
    shared_gpu: SharedGpuSettings | None = Field(default_factory=SharedGpuSettings)
    # Node name glob -> capacity type, checked before the label rules (first match wins).
    capacity_type_override: dict[str, CapacityType] = {}
    # Karpenter, EKS, ACK, GKE and AKS labels by default; a list given here replaces them all.
    capacity_type_labels: list[CapacityRule] = Field(default_factory=_default_capacity_rules)
    # For nodes no override or rule matches: on-demand is the safe guess for unlabelled nodes.
    default_capacity_type: CapacityType = CapacityType.ON_DEMAND
    # Taint key -> the notice it means (value = event id when NTH sets it). The defaults cover
    # NTH, Karpenter and cluster-autoscaler; a mapping given here replaces them all.
    notice_taints: dict[str, NoticeKind] = Field(
        default_factory=lambda: dict(DEFAULT_NOTICE_TAINTS)
    )
    # Notice taints that mean a voluntary disruption (NoticeKind.DISRUPTION: consolidation or
    # drift, which a policy's preemption.voluntary handles) while the Node is not being deleted:
    # Karpenter's disruption controller taints a live node before it launches the replacement
    # and deletes the NodeClaim (pkg/controllers/disruption/queue.go `markDisrupted`); on an
    # interruption, expiry or manual delete the same taint comes from the Node's termination
    # finalizer, on a Node already being deleted (node/termination/controller.go `finalize`)
    voluntary_taints: list[str] = ["karpenter.sh/disrupted"]
    # Node condition type (status True) -> notice; ack-node-problem-detector sets InstanceExpired.
    notice_conditions: dict[str, NoticeKind] = {"InstanceExpired": NoticeKind.INTERRUPTION}
    # A cordoned node as a maintenance notice (its workers leave). Off: cordoned nodes only stop
    # receiving new workers, since people cordon for many reasons.
    cordon_is_notice: bool = False
    # One PodDisruptionBudget (maxUnavailable 0) per managed et-operator job, so evictions by NTH,
    # Karpenter, `kubectl drain` or cluster-autoscaler wait while the daemon drains the host from
    # Horovod discovery and has the pod deleted by name. A cordoned node then counts as a notice
    # (someone is draining it and waits on us). See docs/kubernetes.md "Node handlers".
    guard_evictions: bool = True
    # Server-side watch timeout; the client's read timeout is a little longer so a silent
    # connection can never hang a watch. Scale-out timeouts come from the policy, not from here.
    watch_timeout: Duration = timedelta(minutes=5)
    # Most seconds between retries of a failing list/watch (doubling from half a second).
    watch_backoff_max: Duration = timedelta(seconds=30)
    # How often a kind the API server does not serve (an operator's CRD that is not installed) is
    # looked up again in API discovery, so a CRD installed later is picked up without a restart.
    discovery_interval: Duration = timedelta(seconds=60)
    # Retries of a write that got 429 or 5xx before the error goes to the reconciler.
    write_retries: Annotated[int, Field(ge=0, le=10)] = 3
