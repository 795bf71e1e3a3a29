"""`python -m timerome` and the `timerome` command (pyproject's script entry, `main`).

The command line's imports (torch, transformers) take seconds: a Ctrl-C meanwhile ends in one line and
exit status 130, as it does once a command runs (cli/app.friendly), never in a traceback.
"""

import sys


def main() -> None:
    try:
        from timerome.cli import app
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (Ctrl-C) while timerome was starting\n")
        raise SystemExit(130) from None
    app(prog_name="timerome")


if __name__ == "__main__":
    main()
