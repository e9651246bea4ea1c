"""`spot-autoscaler node-agent`: run on every spot GPU node (a DaemonSet with hostNetwork)."""

from __future__ import annotations

import argparse
import os
import sys

import structlog

from autoscaler.adapters.nodeagent.detect import PROVIDERS
from autoscaler.core.policy import parse_duration
from autoscaler.logs import configure
from autoscaler.shutdown import stop_on_signals


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "node-agent",
        description="Poll the instance metadata service (AWS IMDSv2, Alibaba, GCE or Azure "
        "Scheduled Events) and write a notice to the Node's spot-autoscaler.io/notice annotation, "
        "once per notice.",
    )
    p.add_argument(
        "--node",
        default=os.environ.get("NODE_NAME"),
        help="this Node's name (default: $NODE_NAME, from the downward API)",
    )
    p.add_argument("--provider", choices=[*PROVIDERS, "auto"], default="auto")
    p.add_argument(
        "--interval",
        type=_duration,
        help="poll period (default: the provider's: 5s on AWS and Alibaba, 1s on GCE, where each "
        "poll is a long poll of that length, and on Azure)",
    )
    p.add_argument("--metadata-url", help="metadata service base URL (default: the provider's)")
    p.add_argument("--kubeconfig", help="default: the pod's in-cluster service account")
    p.set_defaults(func=cmd_node_agent)


def _duration(value: str) -> object:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_node_agent(args: argparse.Namespace) -> int:
    # Imported here: the kubernetes client is slow to import, and other commands never need it.
    from autoscaler.adapters.kube.client import api_client
    from autoscaler.adapters.nodeagent.agent import NodeAgent
    from autoscaler.adapters.nodeagent.annotator import NodeAnnotator
    from autoscaler.adapters.nodeagent.detect import detect
    from autoscaler.adapters.nodeagent.metadata import MetadataError
    from autoscaler.adapters.nodeagent.pods import NodePods

    if not args.node:
        print("error: --node (or $NODE_NAME) is required", file=sys.stderr)
        return 2
    configure()
    log = structlog.get_logger().bind(source="node-agent", node=args.node)
    try:
        metadata = detect(args.provider, args.metadata_url, args.interval)
    except MetadataError as exc:
        log.error("metadata_unavailable", error=str(exc))
        return 1
    api = api_client(args.kubeconfig)
    interval = args.interval or metadata.interval
    agent = NodeAgent(
        metadata,
        NodeAnnotator(api, args.node),
        interval=interval,
        drained=NodePods(api, args.node).drained,
    )
    stop = stop_on_signals(log)
    log.info(
        "node_agent_started",
        provider=type(metadata).__name__,
        interval_s=interval.total_seconds(),
    )
    agent.run(stop)
    stop.log_received()
    return 0
