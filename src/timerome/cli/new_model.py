"""`timerome new-model`: a fresh LLaDA-structure MDLM with a BPE tokenizer trained on your texts."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from timerome.cli.app import app, console, friendly, print_json, tofu_dir_read
from timerome.common.checks import integer
from timerome.training.new_model import DEFAULT_CONTEXT, DEFAULT_VOCAB


@app.command("new-model")
@friendly
def new_model_cmd(texts: list[str] = typer.Argument(..., help="what the tokenizer learns from: 'embedded:SPLIT', "
                                                              "'tofu:SPLIT' (with --tofu-dir), JSON/JSONL rows files "
                                                              "or text files (one text a line)"),
                  out: Path = typer.Option(..., "--out", "-o", help="new folder for the model (Hugging Face layout)"),
                  size: Optional[str] = typer.Option(None, help="tiny, small (the embedded model's; the default), "
                                                                "base or large"),
                  vocab_size: int = typer.Option(DEFAULT_VOCAB, help="BPE vocabulary size (at most; a small corpus gives fewer)"),
                  context: int = typer.Option(DEFAULT_CONTEXT, help="longest sequence in tokens"),
                  d_model: Optional[int] = typer.Option(None, help="hidden size (overrides --size)"),
                  layers: Optional[int] = typer.Option(None, help="number of blocks (overrides --size)"),
                  heads: Optional[int] = typer.Option(None, help="attention heads (overrides --size)"),
                  mlp: Optional[int] = typer.Option(None, help="MLP hidden size (overrides --size)"),
                  seed: int = typer.Option(0, help="seed of the random initialisation"),
                  tofu_dir: Optional[str] = typer.Option(None, "--tofu-dir", help="local TOFU directory for tofu:SPLIT"),
                  as_json: bool = typer.Option(False, "--json", help="print what was built as JSON")):
    """Create a fresh MDLM (LLaDA structure, random weights) and a byte-level BPE tokenizer trained on
    your texts; then `timerome train --model OUT --data ROWS --out TRAINED` with a first training's --lr and
    --epochs (printed at the end: the training defaults fine-tune a trained model, and leave a new one saying
    nothing) teaches it your rows."""
    from timerome.common.files import user_text
    from timerome.training.config import FIRST_TRAINING
    from timerome.training.new_model import new_model

    for value, name in ((vocab_size, "--vocab-size"), (context, "--context"), (d_model, "--d-model"),
                        (layers, "--layers"), (heads, "--heads"), (mlp, "--mlp")):
        if value is not None:  # unset: the size's; the API's first rule under the flags' names (it says "context")
            integer(value, name, lo=1)
    for i, t in enumerate(texts):
        user_text(t, f"text source {i + 1}")
    tofu_dir_read(tofu_dir, *texts)
    info = new_model(texts, out, size=size, vocab_size=vocab_size, context=context, seed=seed, tofu_dir=tofu_dir,
                     d_model=d_model, n_layers=layers, n_heads=heads, mlp_hidden_size=mlp)
    if as_json:
        print_json(info)
        return
    dims = info["dims"]
    console.print(f"new model in {out}: {info['parameters']:,} parameters ({dims['n_layers']} layers, hidden "
                  f"{dims['d_model']}, {dims['n_heads']} heads), BPE vocabulary of {info['vocab_size']} learnt on "
                  f"{info['n_texts']} texts, context {info['context']}", soft_wrap=True)
    console.print(f"next: timerome train --model {out} --data ROWS --out {out}-trained --lr {FIRST_TRAINING['lr']:g} "
                  f"--epochs {FIRST_TRAINING['epochs']} (a first training from random weights; the defaults fine-tune)",
                  soft_wrap=True)
