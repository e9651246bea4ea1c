"""`spot-autoscaler run`: the daemon's command line. Exit 0 on a clean stop or a good `--once`.

Decision lines go to stdout (pipe them into `spot-autoscaler decisions`); everything else the
daemon says goes to stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog

from autoscaler.config import Config, load_config
from autoscaler.core.policy import parse_duration
from autoscaler.daemon.loop import WakeSignal
from autoscaler.daemon.metrics import Metrics
from autoscaler.daemon.service import Daemon
from autoscaler.daemon.wiring import build_parts
from autoscaler.logs import JSON_LINES, configure, processors
from autoscaler.shutdown import stop_on_signals

EXIT_OK, EXIT_FAILED = 0, 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        description="Watch the cluster and cloud notices, reconcile every elastic job's worker "
        "count, serve /metrics, /healthz and /readyz. Stops cleanly on SIGTERM or SIGINT.",
    )
    p.add_argument("--config", type=Path, required=True, help="config YAML (re-read while running)")
    p.add_argument(
        "--kubeconfig", type=Path, help="default: in-cluster service account, else ~/.kube/config"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="decide and log, change nothing (not even the Lease)"
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="one pass once caches have synced, then exit; exit 1 at once (one line) when the API "
        "server does not answer within --connect-timeout",
    )
    p.add_argument(
        "--connect-timeout",
        type=parse_duration,
        default=timedelta(seconds=10),
        metavar="DURATION",
        help="with --once: how long to try reaching the API server (default 10s)",
    )
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="daemon.log_level"
    )
    p.add_argument("--log-format", choices=list(JSON_LINES), help="daemon.log_format")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    config = _with_flags(load_config(args.config), args)  # a bad file at start: the CLI lists it
    settings = config.daemon
    json_lines = JSON_LINES[settings.log_format]
    configure(json_lines, settings.log_level)
    # Our scheduled jobs catch and log their own errors (structlog, JSON); apscheduler's plain-text
    # stdlib warnings would only break the log format.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    logger = structlog.get_logger("spot-autoscaler")
    wake, metrics = WakeSignal(), Metrics()
    try:
        parts = build_parts(
            config, wake, logger, metrics.error, kubeconfig=args.kubeconfig, dry_run=args.dry_run
        )
    except Exception as exc:  # no cluster to talk to, missing credentials: say so, exit non-zero
        logger.error("startup_failed", error=f"{type(exc).__name__}: {exc}")
        return EXIT_FAILED
    daemon = Daemon(
        config, parts, wake, logger, _decision_logger(config, json_lines), args.config, metrics
    )
    if args.once:
        if problem := parts.reachable(args.connect_timeout.total_seconds()):
            logger.error(
                "api_unreachable", error=problem, waited_s=args.connect_timeout.total_seconds()
            )
            return EXIT_FAILED
        return EXIT_OK if daemon.run_once() else EXIT_FAILED
    stop = stop_on_signals(logger)
    try:
        daemon.run_until(stop)
    except Exception as exc:  # start-up failed (e.g. the metrics port is taken); stop() ran
        logger.error("daemon_failed", error=f"{type(exc).__name__}: {exc}")
        return EXIT_FAILED
    return EXIT_OK


def _with_flags(config: Config, args: argparse.Namespace) -> Config:
    """The command line's log settings over the file's (they stay put when the file reloads:
    logging is set up once)."""
    flags = {
        key: value
        for key, value in (("log_level", args.log_level), ("log_format", args.log_format))
        if value is not None
    }
    if not flags:
        return config
    return config.model_copy(update={"daemon": config.daemon.model_copy(update=flags)})


def _decision_logger(config: Config, json_lines: bool | None) -> Any:
    """Decisions on stdout, in the same format and level as the rest."""
    return structlog.wrap_logger(
        structlog.WriteLogger(sys.stdout),
        processors=processors(not sys.stdout.isatty() if json_lines is None else json_lines),
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelName(config.daemon.log_level.upper())
        ),
    )
