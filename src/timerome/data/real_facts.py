"""Real facts a real pretrained model knows, for the AR-versus-MDLM contrast (docs/ar-contrast.md).

`assets/real-facts.json` (written for this project): 34 hand-written prompts (capitals, landmarks,
official languages, origins) with the object SmolLM2-135M-Instruct answers greedily and a
counterfactual target of the same type, plus 22 `unrelated` prompts (locality) that share no subject
with them and that the model answers correctly with a clear margin: its top next token at least twice
as likely as the runner-up (a prompt whose two top tokens nearly tie flips under any small change,
an edit that changes nothing else included, so it would measure the tie, not the edit). `prose_texts` is a corpus of English prose every Python installation carries (the
reference manual's topic texts, `pydoc_data`): the background a real model's key statistics and
whitening are measured on where ROME uses Wikipedia, which is not available offline.

    facts, unrelated = real_facts()           # timerome.data.facts.Fact, facts with their target
    task = real_fact_task()                   # a ForgetTask: the facts, unrelated rows, prose background
    timerome trace --positional -m MODEL.gguf --data real-facts
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from timerome.data.facts import Fact

PATH = Path(__file__).resolve().parent.parent / "assets" / "real-facts.json"
NAME = "real-facts"  # how --data names it


def real_rows() -> tuple[list[dict], list[dict]]:
    """(fact rows, unrelated rows): question / answer / subject (/ target) dicts."""
    doc = json.loads(PATH.read_text(encoding="utf-8"))
    return list(doc["facts"]), list(doc["unrelated"])


def _fact(row: dict) -> Fact:
    return Fact(subject=row["subject"], prompt=row["question"], object=row["answer"], target=row.get("target"),
                fact_id=row["fact_id"])


def real_facts() -> tuple[list[Fact], list[Fact]]:
    """(facts with their counterfactual target, unrelated facts)."""
    rows, unrelated = real_rows()
    return [_fact(r) for r in rows], [_fact(r) for r in unrelated]


def prose_texts(n: int = 300, min_chars: int = 80) -> list[str]:
    """Up to n paragraphs of English prose from Python's reference-manual topics (deterministic)."""
    from pydoc_data.topics import topics

    paras = [" ".join(p.split()) for key in sorted(topics) for p in re.split(r"\n\s*\n", topics[key])]
    prose = [p for p in paras if len(p) >= min_chars and not p.startswith((">>>", "...")) and p[0].isupper()]
    return prose[:n]


def real_fact_task(n_background: int = 300):
    """The ForgetTask of the real facts: every fact (its target the counterfactual), the unrelated
    prompts as retain rows, and prose + the facts' own texts as the background corpus."""
    from timerome.data.task import ForgetTask

    rows, unrelated = real_rows()
    facts, _ = real_facts()
    texts = [f"{r['question']} {r['answer']}" for r in rows + unrelated]
    return ForgetTask(forget_rows=rows, facts=facts, retain_rows=unrelated, background=prose_texts(n_background) + texts)
