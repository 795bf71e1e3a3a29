"""Rows of a Hugging Face Hub dataset split, through `datasets` (optional), or one clear error.

Offline, `datasets` retries for half a minute and prints a page of logs before it fails; a
three-second connection check says at once that the Hub cannot be reached (set HF_HUB_OFFLINE=1 to
read `datasets`' own cache instead), and the libraries' logs stay quiet during the load.
"""

from __future__ import annotations

import logging
import os
import socket

from timerome.errors import TimeromeError

HOST = "huggingface.co"


def reachable(host: str = HOST, timeout: float = 3.0) -> bool:
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_split(hub_id: str, config: str | None, split: str, local: str) -> list[dict]:
    """The rows of hub_id / config / split; `local` says what to pass instead (used in every error)."""
    try:
        import datasets
    except ImportError:
        raise TimeromeError(f"loading {hub_id} from the Hub needs `datasets` (pip install datasets); or {local}") from None
    if not os.environ.get("HF_HUB_OFFLINE") and not reachable():
        raise TimeromeError(f"{hub_id} is on the Hub, which this machine cannot reach ({HOST}:443); {local}")
    quiet = [logging.getLogger(n) for n in ("datasets", "huggingface_hub", "fsspec", "urllib3")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        return [dict(r) for r in datasets.load_dataset(hub_id, config, split=split)]
    except Exception as e:  # noqa: BLE001 - missing config, bad cache, network: one clear message
        raise TimeromeError(f"could not load {hub_id} {config or ''} split {split!r} from the Hub "
                            f"({type(e).__name__}: {str(e)[:200]}); {local}") from None
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
