"""How long from a GCE preemption or an Azure Preempt event to the node agent's Node annotation?

The node agent's own loop (`NodeAgent.run`, at the provider's default interval: GCE's 1 s long
poll on `instance/preempted`, Azure's 1 s poll of Scheduled Events) against the local metadata
servers the tests use (tests/test_gcp_notices.py `FakeGce`, tests/test_azure_notices.py
`FakeImds`: they answer as the documented APIs do) and the Kubernetes API emulator. Each notice is
on a fresh node whose agent has been polling for a random 1.3-2.3 s (so the notice lands anywhere
in a poll), and is timed from the server's change to the annotation being seen on the Node.
docs/cloud.md gives the figures ("GCP: the node agent", "Azure: the node agent").

    .venv/bin/python benchmarks/cloud_notices.py [-n 40] [--provider gce azure] [--seed 35]
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]  # tests/support imports itself as `support`

import structlog  # noqa: E402
from kubernetes.client import ApiClient  # noqa: E402
from support.kube_api import KubeApiServer  # noqa: E402
from test_azure_notices import FakeImds  # noqa: E402
from test_gcp_notices import FakeGce  # noqa: E402
from test_node_agent import metadata_server  # noqa: E402

from autoscaler.adapters.nodeagent.agent import NodeAgent  # noqa: E402
from autoscaler.adapters.nodeagent.annotator import NodeAnnotator  # noqa: E402
from autoscaler.adapters.nodeagent.azure import AzureScheduledEvents  # noqa: E402
from autoscaler.adapters.nodeagent.gcp import GceMetadata  # noqa: E402
from autoscaler.adapters.nodeagent.metadata import Metadata  # noqa: E402
from autoscaler.annotations import NOTICE_ANNOTATION  # noqa: E402

WARM_UP = (1.3, 2.3)  # seconds the agent polls before the notice
TIMEOUT = 30.0  # a notice not annotated by then is a failure (the VM would be gone)


def annotated(api: KubeApiServer, node: str) -> bool:
    annotations = ((api.get("Node", node) or {}).get("metadata") or {}).get("annotations") or {}
    return NOTICE_ANNOTATION in annotations


def one_notice(
    provider: str, node: str, api: KubeApiServer, client: ApiClient, rng: random.Random
) -> float:
    """Seconds from the notice appearing on the metadata server to the Node's annotation."""
    api.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    fake = FakeGce() if provider == "gce" else FakeImds()
    with metadata_server(fake.answer) as url:
        metadata: Metadata = GceMetadata(url) if provider == "gce" else AzureScheduledEvents(url)
        agent = NodeAgent(metadata, NodeAnnotator(client, node))  # the provider's interval
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        try:
            time.sleep(rng.uniform(*WARM_UP))  # the agent polls meanwhile: a notice lands mid-poll
            start = time.monotonic()
            if isinstance(fake, FakeGce):
                fake.set("preempted", "TRUE")
            else:
                fake.schedule("Preempt", datetime.now(UTC) + timedelta(seconds=30))
            while not annotated(api, node):
                if time.monotonic() - start > TIMEOUT:
                    raise SystemExit(f"{provider}: {node} not annotated within {TIMEOUT:g} s")
                time.sleep(0.001)
            return time.monotonic() - start
        finally:
            stop.set()
            fake.released.set()
            thread.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="notices per provider (default 40)")
    parser.add_argument("--provider", nargs="+", choices=["gce", "azure"], default=["gce", "azure"])
    parser.add_argument("--seed", type=int, default=35, help="of the warm-up times (default 35)")
    args = parser.parse_args()
    # the agent's own log lines (one per notice) would swamp the figures
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rng = random.Random(args.seed)
    with KubeApiServer() as api:
        client = api.api_client()
        for provider in args.provider:
            delays = [
                one_notice(provider, f"{provider}-{i}", api, client, rng) for i in range(args.n)
            ]
            ms = sorted(d * 1000 for d in delays)
            p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
            print(
                f"{provider}: notice -> Node annotation over {len(ms)} notices: "
                f"min {ms[0]:.0f} ms  median {statistics.median(ms):.0f} ms  "
                f"p99 {p99:.0f} ms  max {ms[-1]:.0f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
