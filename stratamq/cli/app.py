"""The root ``stratamq`` command group; each subcommand module attaches itself to ``main``."""

from __future__ import annotations

import logging
import sys

import click


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log what StrataMQ does to stderr.")
def main(verbose: bool) -> None:
    """StrataMQ: a RocketMQ-compatible message store and broker."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
