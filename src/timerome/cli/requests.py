"""`timerome requests`: read edit requests (any published format) and show or convert them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from timerome.cli.app import app, console, err_console, friendly, print_json
from timerome.common.checks import integer
from timerome.common.files import output_file
from timerome.engine.settings import EDIT


@app.command("requests")
@friendly
def requests_cmd(source: str = typer.Argument(..., help="a CounterFact / zsRE / MQuAKE / EasyEdit / timerome JSON or "
                                                        "JSONL file, or 'counterfactual:SPLIT' / 'embedded:SPLIT' / "
                                                        "'tofu:SPLIT', or 'real-facts' (34 real facts for a real "
                                                        "English model)"),
                 out: Optional[Path] = typer.Option(None, "--out", "-o", help="write them in timerome's own JSON "
                                                                             "format (one record per request)"),
                 target: Optional[str] = typer.Option(None, help="the target of requests that name none"),
                 limit: Optional[int] = typer.Option(None, help="only the first N requests"),
                 as_json: bool = typer.Option(False, "--json", help="print them as JSON")):
    """Show edit requests as timerome reads them (or write them in its own format with --out)."""
    from timerome.data.requests import load_requests, save_requests

    if limit is not None:  # the API's rule under the flag's name
        integer(limit, "--limit", lo=1)
    if out is not None:
        output_file(out, example="requests.json", inputs={"requests file": source})
    reqs, notes = load_requests(source, target=target, limit=limit, must_fill=target not in (None, EDIT.target))
    for n in notes:
        err_console.print(f"[yellow]note:[/] {escape(n)}", soft_wrap=True)
    if out is not None:
        path = save_requests(reqs, out)
        if not as_json:
            console.print(f"{len(reqs)} requests from {source} -> {path}", soft_wrap=True)
    if as_json:
        print_json([r.as_record() for r in reqs])
        return
    if out is not None:
        return
    t = Table(title=f"{len(reqs)} edit requests from {source}")
    for col in ("id", "prompt", "true answer", "target", "para", "neigh", "same subj", "port"):
        t.add_column(col, overflow="fold")
    for r in reqs[:50]:
        f = r.fact
        t.add_row(*(escape(str(x)) for x in (f.fact_id, f.prompt, f.object, f.target or "–", len(r.paraphrases),
                                              len(r.neighbours), len(r.same_subject), len(r.portability))))
    console.print(t)
    if len(reqs) > 50:
        console.print(f"... and {len(reqs) - 50} more (--json or --out for all)")
