"""The tool subcommands: perplexity, bench, quantize."""
from __future__ import annotations


def add_subcommands(subparsers) -> None:
    pass
