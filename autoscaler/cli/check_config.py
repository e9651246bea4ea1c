"""`spot-autoscaler check-config`: validate a policy YAML file and list every problem."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from autoscaler.cli.exits import EXIT_BAD_CONFIG, EXIT_OK
from autoscaler.config import ConfigError, check_config


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-config")
    p.add_argument("file", type=Path)
    p.set_defaults(func=cmd_check_config)


def cmd_check_config(args: argparse.Namespace) -> int:
    """Exit 2 on problems; warnings are printed (stderr) but the file is still OK (exit 0)."""
    try:
        config, warnings = check_config(args.file, now=datetime.now(UTC))
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"{args.file}: {len(exc.problems)} problem(s)", file=sys.stderr)
        return EXIT_BAD_CONFIG
    for warning in warnings:
        print(warning, file=sys.stderr)
    names = ", ".join(p.name for p in config.policy_set.policies)
    noted = f", {len(warnings)} warning(s)" if warnings else ""
    print(f"{args.file}: OK ({len(config.policy_set.policies)} policies: {names}){noted}")
    return EXIT_OK
