"""The `timerome` command line: `app` with one file of commands per topic."""

from timerome.cli import edit, evaluate, memory, model, new_model, requests, run, trace  # noqa: F401 - importing registers the commands
from timerome.cli.app import app, console, friendly

__all__ = ["app", "console", "friendly"]


def main():  # pragma: no cover
    app()
