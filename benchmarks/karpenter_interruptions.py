"""N Karpenter interruptions of a PyTorchJob's worker with the daemon running, measured.

The real control plane (tests/support/control_plane.py) with the training-operator, Karpenter
v1.8.0's kwok provider (tests/support/karpenter.py; `make karpenter`) and `spot-autoscaler run`
under deploy/rbac.yaml's rules. A 3-worker PyTorchJob (policy `hold`, guarded by the daemon's PDB)
runs on Karpenter's spot nodes; N times, the NodeClaim under worker 1 is deleted (what the AWS
provider does on a spot interruption), and the run waits until the operator's new worker 1 runs
on a node Karpenter launched for it. Printed as one JSON line: graceful removals (drained from
discovery, then deleted by the daemon), evictions that hit a still-visible worker, forced
deletes at the NodePool's terminationGracePeriod, and taint -> drain / taint -> delete latency.

    .venv/bin/python benchmarks/karpenter_interruptions.py [-n 20] [--tgp 30s] [--pod-grace 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]  # tests/support imports itself as `support`

from kubernetes import client  # noqa: E402
from support.control_plane import ControlPlane  # noqa: E402
from support.karpenter import (  # noqa: E402
    POOLS,
    Karpenter,
    interrupt_worker,
    karpenter_bin_dir,
    karpenter_job,
    summary,
)
from support.pytorch_cluster import GROUP, NS, PLURAL, VERSION, Cluster  # noqa: E402
from support.real_cluster import find_bin_dir  # noqa: E402
from support.real_daemon import deployed  # noqa: E402
from support.real_namespace import daemon_config  # noqa: E402
from support.waiting import wait_for  # noqa: E402

from autoscaler.adapters.kube.eviction_guard import guard_name  # noqa: E402
from autoscaler.annotations import DRAINED_ANNOTATION  # noqa: E402

JOB, WORKERS, VICTIM = "bench", 3, "bench-worker-1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="interruptions (20)")
    parser.add_argument("--tgp", default="30s", help="NodePool terminationGracePeriod; '' none")
    parser.add_argument("--pod-grace", type=int, default=20, help="workers' grace seconds (20)")
    args = parser.parse_args()
    bin_dir, why = find_bin_dir()
    if bin_dir is None:
        sys.exit(f"no control plane: {why}")
    started = time.monotonic()
    with ControlPlane(bin_dir) as plane, tempfile.TemporaryDirectory() as tmp:
        plane.start_training_operator()
        with Karpenter(plane, karpenter_bin_dir()) as karpenter:
            api = plane.api_client()
            cluster = Cluster(plane, api, NS, (GROUP, VERSION, PLURAL))
            cluster.core.create_namespace({"metadata": {"name": NS}})
            karpenter.gpu_pools(NS, args.tgp or None)
            cluster.create(karpenter_job(JOB, WORKERS, managed=True, grace=args.pod_grace))
            cluster.wait_settled(JOB, WORKERS)
            with deployed(api, plane, NS, Path(tmp), daemon_config(NS)):
                policy = client.PolicyV1Api(api)
                guard = f"metadata.name={guard_name(JOB)}"
                wait_for(
                    lambda: (
                        policy.list_namespaced_pod_disruption_budget(NS, field_selector=guard).items
                    ),
                    60,
                    "the daemon's guard on the job",
                )
                runs = [
                    interrupt_worker(karpenter, cluster, JOB, VICTIM, WORKERS, DRAINED_ANNOTATION)
                    for _ in range(args.n)
                ]
            cluster.cleanup()
            for pool in POOLS:
                karpenter.delete_node_pool(pool)
    figures = summary(runs)
    figures.update(
        tgp=args.tgp or None,
        pod_grace=args.pod_grace,
        seconds=round(time.monotonic() - started, 1),
        runs=[
            {
                "drain": None if r.drained is None else round(r.drained - r.tainted, 4),
                "delete": None if r.deleting is None else round(r.deleting - r.tainted, 4),
                "graceful": r.graceful,
            }
            for r in runs
        ],
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
