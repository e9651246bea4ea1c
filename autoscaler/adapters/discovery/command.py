"""`discovery-sidecar` and `discovery-scripts`: the launcher pod's side of overlay discovery."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kubernetes.config import ConfigException
from pydantic import ValidationError

from autoscaler.adapters.discovery.scripts import install_scripts
from autoscaler.adapters.discovery.sidecar import DrainSidecar, JobRef, api_client
from autoscaler.config.discovery import DiscoverySettings
from autoscaler.core.policy import parse_duration
from autoscaler.logs import configure


def add_parser(sub: argparse._SubParsersAction) -> None:
    defaults = DiscoverySettings()
    p = sub.add_parser(
        "discovery-sidecar",
        help="in the launcher pod: keep the drain file equal to the job's drained-hosts annotation",
        description="Watch one et-operator TrainingJob and write DIR/DRAIN_FILE (one hostname per "
        "line, atomically) from its spot-autoscaler.io/drained-hosts annotation, for the shipped "
        "discover_hosts.sh. Runs until killed.",
    )
    p.add_argument("--job", required=True, type=_job_ref, metavar="NAMESPACE/NAME")
    p.add_argument("--dir", type=Path, default=defaults.dir,
                   help=f"shared directory (default {defaults.dir})")
    p.add_argument("--drain-file", default=defaults.drain_file,
                   help=f"file name in DIR (default {defaults.drain_file})")
    p.add_argument("--kubeconfig", help="default: the pod's service account (in-cluster)")
    p.add_argument("--watch-timeout", type=parse_duration, default=defaults.watch_timeout,
                   help="server-side watch timeout before resuming (default 5m)")
    p.add_argument("--backoff-max", type=parse_duration, default=defaults.backoff_max,
                   help="longest pause between retries after API errors (default 30s)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=cmd_discovery_sidecar)


def add_scripts_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "discovery-scripts",
        help="copy the Horovod discovery scripts into a directory (e.g. from an init container)",
        description="Install discover_hosts.sh (et-operator overlay) and owned_hosts.sh "
        "(standalone) into DIR with mode 0755; prints their paths.",
    )
    p.add_argument("dir", type=Path)
    p.set_defaults(func=cmd_discovery_scripts)


def _job_ref(text: str) -> JobRef:
    try:
        return JobRef.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_discovery_sidecar(args: argparse.Namespace) -> int:
    configure(level=args.log_level)
    try:
        settings = DiscoverySettings(
            dir=args.dir, drain_file=args.drain_file,
            watch_timeout=args.watch_timeout, backoff_max=args.backoff_max,
        )
        api = api_client(args.kubeconfig)
    except (ValidationError, ConfigException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sidecar = DrainSidecar(
        api, args.job, settings.drain_path, settings.watch_timeout, settings.backoff_max
    )
    sidecar.run()  # SIGTERM ends the process: every write is atomic, nothing to flush
    return 0


def cmd_discovery_scripts(args: argparse.Namespace) -> int:
    for path in install_scripts(args.dir):
        print(path)
    return 0
