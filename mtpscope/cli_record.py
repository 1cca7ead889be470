"""CLI commands: record (the real llama.cpp MTP loop; see traces/recorder.py)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root ``mtpscope`` app."""
