"""Residual statistics at one coordinate: the background mean mu and covariance C.

The edit memory's "whitened" key metric scores a live residual h against a stored subject key u
by (u - mu)^T C^-1 (h - mu) instead of the paper's raw u^T h. Every residual at a layer shares a
large common component (mu) and a few high-variance directions; the raw dot product is dominated
by them, so every token "matches" every fact a little. Centering and whitening leave only what
is specific to the subject, which is what makes the edit selective.

mu and C are measured once, on a background corpus the model knows (for the embedded model: its
own training rows), and stored in the memory file. Texts are seen clean; `masked_copies` adds
copies with a random fraction of tokens masked (what the hook sees mid-denoising), which changed
nothing measurable on the embedded model's selectivity, so it is off by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from timerome.common.checks import generator_arg, is_int, is_real
from timerome.common.files import input_file, read_text
from timerome.data.corpus import make_corpus, training_rows
from timerome.data.real_facts import NAME as REAL_FACTS
from timerome.data.real_facts import real_fact_task
from timerome.data.rows import load_rows, tofu_dir_read
from timerome.engine.coordinate import Coordinate
from timerome.engine.encoding import pad_sequences, text_ids
from timerome.engine.hooks import run_to
from timerome.errors import TimeromeError

DEFAULT_SHRINKAGE = 0.05


@dataclass(frozen=True)
class ResidualStats:
    """Background statistics at (layer, point); all tensors float64 on CPU."""

    layer: int
    point: str
    mean: torch.Tensor       # [H]
    cov: torch.Tensor        # [H, H], already shrunk: invertible
    n_tokens: int
    shrinkage: float

    def __post_init__(self):  # a saved file's statistics are read back through here: wrong ones refused, not used
        H = self.mean.shape[0] if torch.is_tensor(self.mean) and self.mean.dim() == 1 else None
        if H is None or not torch.is_tensor(self.cov) or tuple(self.cov.shape) != (H, H):
            shapes = tuple(getattr(self.mean, "shape", ())), tuple(getattr(self.cov, "shape", ()))
            raise TimeromeError(f"background statistics need a mean [H] and a covariance [H, H], got shapes "
                                f"{shapes[0]} and {shapes[1]}")
        if not is_int(self.n_tokens) or self.n_tokens < 1:
            raise TimeromeError(f"background statistics' n_tokens must be an integer >= 1, got {self.n_tokens!r:.40}")
        if not is_real(self.shrinkage) or not 0.0 <= self.shrinkage <= 1.0:
            raise TimeromeError(f"background statistics' shrinkage must be a number in [0, 1], got "
                                f"{self.shrinkage!r:.40}")

    def precision(self) -> torch.Tensor:
        """C^-1 [H, H] through the Cholesky factor (C is SPD after shrinkage)."""
        L = _cholesky(self.cov)
        return torch.cholesky_inverse(L)


def residual_stats(backbone, coord, texts, *, batch_size: int = 32, shrinkage: float = DEFAULT_SHRINKAGE,
                   masked_copies: int = 0, generator: torch.Generator | None = None) -> ResidualStats:
    """mu [H] and shrunk covariance C [H, H] of the residual at coord over every token of `texts`.

    coord: a Coordinate or (layer, point). texts: strings (or lists of token ids); texts longer
    than the context are cut. masked_copies: extra copies of each text with a fraction t ~ U(0, 1)
    of its tokens set to the mask token (seeded by `generator`, default seed 0).
    C_shrunk = (1 - s) C + s * mean(diag C) * I keeps C invertible when tokens are few.
    """
    layer, point = Coordinate.of(coord).site
    if not 0.0 <= shrinkage <= 1.0:
        raise TimeromeError(f"shrinkage must lie in [0, 1], got {shrinkage}")
    if batch_size < 1 or masked_copies < 0:
        raise TimeromeError(f"batch_size must be >= 1 and masked_copies >= 0 (got {batch_size}, {masked_copies})")
    seqs = [s for s in (text_ids(backbone, t) for t in texts) if s]
    if not seqs:
        raise TimeromeError("the background corpus is empty: give at least one non-empty text")
    g = generator_arg(generator) if generator is not None else torch.Generator().manual_seed(0)
    seqs = seqs + [_masked(s, backbone.mask_id, g) for _ in range(masked_copies) for s in seqs]
    seqs.sort(key=len)  # batches of similar lengths: little padding

    acc = _Moments(backbone.hidden_size)
    with torch.no_grad():
        for start in range(0, len(seqs), batch_size):
            ids, real = pad_sequences(seqs[start:start + batch_size], backbone)
            h = run_to(backbone, (layer, point), ids, real)  # [B, L, H]
            acc.add(h[real].double().cpu())
    mean, cov = acc.result()
    if not (torch.isfinite(mean).all() and torch.isfinite(cov).all()):
        raise TimeromeError(f"the residual at layer {layer} {point} has NaN/inf values on the background corpus")
    scale = cov.diagonal().mean()
    cov = (1 - shrinkage) * cov + shrinkage * scale * torch.eye(len(mean), dtype=torch.float64)
    _cholesky(cov)  # fail here, with a clear message, rather than inside the edit memory
    return ResidualStats(layer % backbone.n_layers, point, mean, cov, acc.n, float(shrinkage))


def stats_at(backbone, coordinate, background=None, *, shrinkage: float = DEFAULT_SHRINKAGE,
             batch_size: int = 32) -> ResidualStats:
    """The background statistics a memory at `coordinate` whitens with: `background` itself when it is
    ResidualStats (checked: its site and hidden size), else measured on its texts (`background_texts`)."""
    coord = Coordinate.of(coordinate)
    if isinstance(background, ResidualStats):
        if (background.layer, background.point) != coord.site:
            raise TimeromeError(f"background statistics are for layer {background.layer} {background.point}, "
                                f"the memory acts at layer {coord.layer} {coord.point}")
        if background.mean.shape != (backbone.hidden_size,):
            raise TimeromeError(f"background statistics have hidden size {len(background.mean)}, the model "
                                f"{backbone.hidden_size}")
        return background
    texts = background_texts(backbone, background)
    return residual_stats(backbone, coord, texts, batch_size=batch_size, shrinkage=shrinkage)


# ------------------------------------------------------------------------------ background texts


def background_texts(backbone, background=None, tofu_dir=None) -> list[str]:
    """The texts whose residuals define mu and C.

    None: the embedded model's own training rows (other models must name a corpus);
    'embedded:SPLIT' / 'tofu:SPLIT': that split's rows (TOFU from `tofu_dir`, else $TIMEROME_TOFU_DIR);
    'real-facts': the real facts' corpus (English prose and the facts' own texts: `real_fact_task`); a path: a
    JSON/JSONL file of question/answer rows or a plain text file (one text per line); a list of
    strings: used as is. tofu_dir is refused where `background` is no 'tofu:SPLIT'.
    """
    tofu_dir_read(tofu_dir, background)
    if background is None:
        if not getattr(backbone, "embedded", False):
            raise TimeromeError(
                "the whitened key metric needs a background corpus for this model (background= or --background): "
                "a text file, a JSON/JSONL file of question/answer rows, a split like tofu:retain90, or a list of texts "
                "(or use key_metric='paper')")
        return rows_to_texts(training_rows(make_corpus(seed=0)))
    if isinstance(background, str) and background.startswith(("embedded:", "tofu:")):
        return rows_to_texts(load_rows(background, tofu_dir=tofu_dir))
    if isinstance(background, str) and background == REAL_FACTS:
        return real_fact_task().background
    if isinstance(background, (str, Path)):
        if not Path(background).exists():  # a missing file, or a misspelt spec ('embeded:retain90'): the specs named
            raise TimeromeError(f"the background {str(background)!r} is neither 'embedded:SPLIT', 'tofu:SPLIT', "
                                f"{REAL_FACTS!r} nor an existing file (a text file, one text per line, or a JSON/JSONL "
                                "file of rows)")
        return read_texts(background)
    texts = list(background) if hasattr(background, "__iter__") and not isinstance(background, (bytes, dict)) else None
    if texts is None or not all(isinstance(t, str) for t in texts):  # any iterable of texts: a datasets column too
        raise TimeromeError(f"background must be None, 'embedded:SPLIT', 'tofu:SPLIT', {REAL_FACTS!r}, a file path, "
                            f"texts (a list, or any iterable of them) or ResidualStats, got {type(background).__name__}")
    return texts


def read_texts(path) -> list[str]:
    p = input_file(path, "background corpus", stream=True)
    if p.suffix in (".json", ".jsonl"):
        return rows_to_texts(load_rows(str(p)))
    lines = [l.strip() for l in read_text(p, "background corpus").splitlines()]
    return [l for l in lines if l]


def rows_to_texts(rows) -> list[str]:
    # a row is seen as the model was trained on it: the question followed by its answer
    return [f"{r['question']} {r['answer']}".strip() for r in rows]


# ------------------------------------------------------------------------------ helpers


def _masked(ids: list[int], mask_id: int, g: torch.Generator) -> list[int]:
    t = float(torch.rand((), generator=g))
    hide = torch.rand(len(ids), generator=g) < t
    return [mask_id if m else i for i, m in zip(ids, hide.tolist())]


class _Moments:
    """Running mean and scatter in float64, shifted by the first batch's mean against cancellation."""

    def __init__(self, H: int):
        self.n, self.shift = 0, None
        self.s1 = torch.zeros(H, dtype=torch.float64)
        self.s2 = torch.zeros(H, H, dtype=torch.float64)

    def add(self, x: torch.Tensor):  # x [N, H]
        if self.shift is None:
            self.shift = x.mean(0)
        y = x - self.shift
        self.n += len(y)
        self.s1 += y.sum(0)
        self.s2 += y.T @ y

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.n < 2:
            raise TimeromeError("the background corpus must have at least 2 tokens")
        m = self.s1 / self.n
        cov = (self.s2 - self.n * torch.outer(m, m)) / (self.n - 1)
        return self.shift + m, (cov + cov.T) / 2


def _cholesky(cov: torch.Tensor) -> torch.Tensor:
    L, info = torch.linalg.cholesky_ex(cov)
    if int(info) != 0:
        raise TimeromeError("the background covariance is singular: use more background text or a "
                            "larger shrinkage")
    return L
