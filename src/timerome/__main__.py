"""`python -m timerome` is the `timerome` command."""

from timerome.cli import app

app(prog_name="timerome")
