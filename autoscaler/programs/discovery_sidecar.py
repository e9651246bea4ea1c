"""`discovery-sidecar` and `discovery-scripts`: the launcher pod's side of overlay discovery."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from autoscaler.adapters.discovery.scripts import install_scripts
from autoscaler.adapters.discovery.sidecar import ContainerRef, JobRef, run_sidecar
from autoscaler.adapters.kube.client import api_client
from autoscaler.adapters.kube.kinds import KINDS
from autoscaler.config.discovery import DiscoverySettings
from autoscaler.core.policy import parse_duration
from autoscaler.logs import configure

ASSIGNED_FILE = "assigned-hosts"  # = discover_hosts.sh's SPOT_ASSIGNED_FILE default, in /etc/edl


def add_parser(sub: argparse._SubParsersAction) -> None:
    defaults = DiscoverySettings()
    p = sub.add_parser(
        "discovery-sidecar",
        description="Watch one job (an et-operator TrainingJob, or of --kind) and write "
        "DIR/DRAIN_FILE (one hostname per line, atomically) from its "
        "spot-autoscaler.io/drained-hosts annotation, for the shipped discover_hosts.sh; publish "
        "DIR/ASSIGNED_FILE (written by that script) as the job's "
        "spot-autoscaler.io/assigned-hosts annotation. Runs until killed, or with "
        "--exit-with-container until that container of its own pod has terminated.",
    )
    p.add_argument("--job", required=True, type=_job_ref, metavar="NAMESPACE/NAME")
    p.add_argument(
        "--kind",
        default=KINDS[0].backend,
        choices=[k.backend for k in KINDS],
        help=f"the operator the job belongs to (default {KINDS[0].backend})",
    )
    p.add_argument(
        "--dir", type=Path, default=defaults.dir, help=f"shared directory (default {defaults.dir})"
    )
    p.add_argument(
        "--drain-file",
        default=defaults.drain_file,
        help=f"file name in DIR (default {defaults.drain_file})",
    )
    p.add_argument(
        "--assigned-file",
        default=ASSIGNED_FILE,
        help=f"file name in DIR written by discover_hosts.sh (default {ASSIGNED_FILE})",
    )
    p.add_argument(
        "--exit-with-container",
        metavar="NAME",
        help="exit 0 once container NAME of this pod has terminated (needs the env "
        "POD_NAME and POD_NAMESPACE); for clusters without native sidecars",
    )
    p.add_argument("--kubeconfig", help="default: the pod's service account (in-cluster)")
    p.add_argument(
        "--watch-timeout",
        type=parse_duration,
        default=defaults.watch_timeout,
        help="server-side watch timeout before resuming (default 5m)",
    )
    p.add_argument(
        "--backoff-max",
        type=parse_duration,
        default=defaults.backoff_max,
        help="longest pause between retries after API errors (default 30s)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_discovery_sidecar)


def add_scripts_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "discovery-scripts",
        description="Install discover_hosts.sh (overlay for et-operator and mpi-operator jobs) "
        "and owned_hosts.sh (standalone) into DIR with mode 0755; prints their paths.",
    )
    p.add_argument("dir", type=Path)
    p.set_defaults(func=cmd_discovery_scripts)


def _job_ref(text: str) -> JobRef:
    try:
        return JobRef.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_discovery_sidecar(args: argparse.Namespace) -> int:
    # here, where the sidecar runs: the module itself names no SDK (`discovery-scripts`)
    from kubernetes.config import ConfigException

    configure(level=args.log_level)
    try:
        settings = DiscoverySettings(
            dir=args.dir,
            drain_file=args.drain_file,
            watch_timeout=args.watch_timeout,
            backoff_max=args.backoff_max,
        )
        exit_with = _own_container(args.exit_with_container)
        api = api_client(args.kubeconfig)
    except (ValidationError, ConfigException, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    job = replace(args.job, resource=next(k.jobs for k in KINDS if k.backend == args.kind))
    run_sidecar(
        api,
        job,
        settings.drain_path,
        settings.dir / args.assigned_file,
        exit_with,
        settings.watch_timeout,
        settings.backoff_max,
    )  # SIGTERM ends the process: every write is atomic, nothing to flush
    return 0


def _own_container(name: str | None) -> ContainerRef | None:
    """Container NAME of the pod the downward API names in POD_NAMESPACE/POD_NAME."""
    if name is None:
        return None
    pod, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not pod or not namespace:
        raise ValueError("--exit-with-container needs POD_NAME and POD_NAMESPACE (downward API)")
    return ContainerRef(namespace, pod, name)


def cmd_discovery_scripts(args: argparse.Namespace) -> int:
    for path in install_scripts(args.dir):
        print(path)
    return 0
