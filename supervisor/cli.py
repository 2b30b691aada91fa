"""Command line: parses arguments, builds the pieces, maps outcomes to exit codes.

Subcommands arrive with the issues that implement them (run, explain, status, scale).
"""

from __future__ import annotations

import argparse

from supervisor import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic-supervisor",
        description="Fault-tolerance supervisor for elastic Horovod training on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)
    return 0
