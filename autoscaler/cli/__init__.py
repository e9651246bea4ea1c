"""`spot-autoscaler` command line: each subcommand is a small function returning an exit code.

A subcommand's module is imported only when that subcommand runs: `simulate` never loads the
kubernetes SDK, nor `decisions` the simulator; `--help` lists them all from `COMMANDS`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module

from autoscaler import __version__
from autoscaler.bench.params import ParamsError
from autoscaler.cli.exits import EXIT_BAD_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_PIPE_CLOSED
from autoscaler.config import ConfigError
from autoscaler.decisionlog import LogInputError
from autoscaler.sim.trace import TraceError

__all__ = ["COMMANDS", "EXIT_BAD_CONFIG", "EXIT_FAILED", "EXIT_OK", "EXIT_PIPE_CLOSED", "main"]


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand: its name and one-line help, and the function in `module` that adds its
    parser (with its description, arguments and `func`) to the subparsers."""

    name: str
    help: str
    module: str
    add_parser: str = "add_parser"

    def register(self, sub: argparse._SubParsersAction) -> None:
        getattr(import_module(self.module), self.add_parser)(sub)


COMMANDS: tuple[Command, ...] = (
    Command(
        "run",
        "run the autoscaler daemon against a cluster (or standalone hosts)",
        "autoscaler.daemon.command",
    ),
    Command(
        "simulate",
        "replay spot availability through the core (no cluster, no cloud)",
        "autoscaler.cli.simulate",
    ),
    Command(
        "bench",
        "compare the autoscaler with baselines and an oracle on a spot trace",
        "autoscaler.bench.command",
    ),
    Command(
        "check-config",
        "validate a policy YAML file; list every problem",
        "autoscaler.cli.check_config",
    ),
    Command(
        "decisions", "show decision log lines as a table, filtered", "autoscaler.cli.decisions"
    ),
    Command(
        "node-agent",
        "report this node's spot notices from instance metadata onto its Node",
        "autoscaler.programs.node_agent",
    ),
    Command(
        "discovery-sidecar",
        "in the launcher pod: the drain file from the job, the assigned hosts to the job",
        "autoscaler.programs.discovery_sidecar",
    ),
    Command(
        "discovery-scripts",
        "copy the Horovod discovery scripts into a directory (e.g. from an init container)",
        "autoscaler.programs.discovery_sidecar",
        "add_scripts_parser",
    ),
)


def main(argv: list[str] | None = None) -> int:
    """Run one command. Whatever goes wrong ends in one line on stderr and an exit code, never a
    traceback (`--debug` shows one for errors we did not foresee)."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"config error:\n{exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except ParamsError as exc:
        print(f"params error:\n{exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except LogInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except BrokenPipeError:
        _detach_stdout()
        return EXIT_PIPE_CLOSED
    except KeyboardInterrupt:
        return 130
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        if args.debug:
            raise
        if exc.filename is None:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except Exception as exc:
        if args.debug:
            raise
        print(f"error: {type(exc).__name__}: {exc} (--debug shows where)", file=sys.stderr)
        return EXIT_FAILED


def _detach_stdout() -> None:
    """The reader went away (`| head`): point stdout at /dev/null so that the interpreter's
    flush at exit has nowhere to fail and prints no "Exception ignored" traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for `argv`: the subcommand it runs in full, the others by name and help."""
    parser = argparse.ArgumentParser(
        prog="spot-autoscaler",
        description="Scale elastic Horovod jobs on spot GPUs from preemption notices, idle "
        "capacity and cost policies.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an unexpected error"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _command_word(argv)
    for command in COMMANDS:
        if command.name == chosen:
            command.register(sub)
        else:
            sub.add_parser(command.name, help=command.help)
    return parser


def _command_word(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names: its first word that is not an option (the options before
    it take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)
