"""The leader fence on the real kube-apiserver (deploy/leader-fence.yaml, issue 34).

The daemon's own fence cannot close the gap between its last check and its bytes reaching the
server: a replica paused there resumes and writes on a Lease another replica holds (the fault
suite's `write_by_non_leader`, seed 17: a resumed replica's checkpoint-signal PATCH). The shipped
ValidatingAdmissionPolicy admits a write of the daemon's ServiceAccount only from the pod the Lease
names. Here two pods of that account write through the daemon's own write path (`ObjectApi`)
with their client-side fence open, as a replica resumed in that gap: only the holder's write
lands, the other's is refused as NotLeader and changes nothing, and a takeover turns them round.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from support.control_plane import ControlPlane
from support.leader_fence import leader_fence
from support.real_daemon import grant_deploy_rbac
from support.waiting import wait_for

from autoscaler.adapters.kube.objects import ObjectApi
from autoscaler.adapters.kube.resources import PODS
from autoscaler.fencing import Fence, NotLeader

pytestmark = pytest.mark.real_cluster

NS, ACCOUNT, LEASE = "leader-fence", "spot-autoscaler", "spot-autoscaler"
REPLICAS = ("daemon-a", "daemon-b")
WORKER = "bert-worker-0"  # a job's pod: the checkpoint signal's annotation is patched on it


@pytest.fixture(scope="module")
def replicas(control_plane: ControlPlane) -> Iterator[dict[str, ObjectApi]]:
    """Each replica's write path, with its pod-bound token and its own fence open."""
    admin = control_plane.api_client()
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": NS}})
    grant_deploy_rbac(admin, control_plane, NS, ACCOUNT)
    core.create_namespaced_pod(
        NS,
        {
            "metadata": {"name": WORKER},
            "spec": {
                "nodeSelector": {"spot-autoscaler.io/test": "nowhere"},
                "containers": [{"name": "w", "image": "w"}],
            },
        },
    )
    coordination = client.CoordinationV1Api(admin)
    coordination.create_namespaced_lease(
        NS,
        {
            "metadata": {"name": LEASE},
            "spec": {"holderIdentity": REPLICAS[0], "leaseDurationSeconds": 15},
        },
    )
    with leader_fence(admin, NS, ACCOUNT, LEASE):
        apis = {
            name: ObjectApi(
                control_plane.client_for_token(control_plane.token_for(ACCOUNT, NS, pod=name)),
                retries=0,
                fence=Fence.open(),  # the gap: this replica's own check passed
            )
            for name in REPLICAS
        }
        # the policy is compiled and its Lease informed a moment after they are made
        wait_for(lambda: refused(apis[REPLICAS[1]], "probe"), 30, "the fence in force")
        yield apis
    core.delete_namespace(NS)
    admin.close()


def signal(api: ObjectApi, by: str, key: str = "spot-autoscaler.io/test-signal") -> str:
    """`by` patches the worker's annotation: 'landed', or why not."""
    patch = {"metadata": {"annotations": {key: by}}}
    try:
        api.merge_patch(PODS, NS, WORKER, patch)
    except NotLeader as exc:
        return f"refused: {exc}"
    return "landed"


def refused(api: ObjectApi, by: str) -> bool:
    return signal(api, by, "spot-autoscaler.io/test-probe").startswith("refused")


def annotation(control_plane: ControlPlane) -> str | None:
    with control_plane.api_client() as admin:
        pod = client.CoreV1Api(admin).read_namespaced_pod(WORKER, NS)
    return (pod.metadata.annotations or {}).get("spot-autoscaler.io/test-signal")


def take_over(control_plane: ControlPlane, holder: str) -> None:
    with control_plane.api_client() as admin:
        coordination = client.CoordinationV1Api(admin)
        lease = coordination.read_namespaced_lease(LEASE, NS)
        lease.spec.holder_identity = holder
        coordination.replace_namespaced_lease(LEASE, NS, lease)


def test_only_the_pod_the_lease_names_writes(
    control_plane: ControlPlane, replicas: dict[str, ObjectApi]
) -> None:
    a, b = REPLICAS
    why = signal(replicas[b], b)
    assert f"spot-autoscaler leader fence: pod {b} does not hold Lease {LEASE}" in why
    assert annotation(control_plane) is None  # the refused write changed nothing
    assert signal(replicas[a], a) == "landed" and annotation(control_plane) == a

    take_over(control_plane, b)  # a stalled past its lease; b took it
    wait_for(lambda: refused(replicas[a], a), 5, "the old holder refused")
    assert annotation(control_plane) == a
    assert signal(replicas[b], b) == "landed" and annotation(control_plane) == b


def test_other_accounts_and_the_lease_itself_pass(
    control_plane: ControlPlane, replicas: dict[str, ObjectApi]
) -> None:
    """The policy holds only the daemon's writes besides its election: an admin's write, and a
    replica renewing or taking the Lease, go through whoever holds it."""
    with control_plane.api_client() as admin:
        core = client.CoreV1Api(admin)
        patch = {"metadata": {"annotations": {"by-admin": "yes"}}}
        core.patch_namespaced_pod(WORKER, NS, patch)
    token = control_plane.token_for(ACCOUNT, NS, pod=REPLICAS[0])
    with control_plane.client_for_token(token) as api:
        coordination = client.CoordinationV1Api(api)
        lease = coordination.read_namespaced_lease(LEASE, NS)
        holder = lease.spec.holder_identity
        lease.spec.holder_identity = REPLICAS[0]
        try:
            coordination.replace_namespaced_lease(LEASE, NS, lease)
        except ApiException as exc:  # pragma: no cover - the assertion says what came back
            pytest.fail(f"the Lease write by {REPLICAS[0]} (holder {holder}) refused: {exc.body}")
