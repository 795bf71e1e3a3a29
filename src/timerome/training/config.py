"""The training settings, one default each (no torch: the command line reads its option defaults here)."""

from __future__ import annotations

from dataclasses import dataclass

from timerome.engine.settings import LIKELIHOOD


@dataclass
class TrainConfig:
    epochs: int = 10
    lr: float = 1e-4
    batch_size: int = 16
    weight_decay: float = 0.0
    warmup_frac: float = 0.05
    eps: float = LIKELIHOOD.eps
    lora_r: int = 0          # 0: full fine-tuning; the paper's protocol is r=128
    lora_alpha: int | None = None
    grad_clip: float = 1.0
    seed: int = 0
    eos_pad: bool | None = None  # LLaDA SFT: answers end in EOS, padded with EOS; None: the checkpoint's recipe
                                 # (`train.recipe_eos_pad`; train.py's docstring)
    eos_extra: int = 0       # eos_pad: 1..eos_extra + 1 EOS per row, drawn per row (train.py's docstring)


# a first training of a new model (random weights): `timerome new-model`'s next step says it, and `train` (the
# command and the function) notes it where a new model is trained at the fine-tuning defaults (lr 1e-4, 10 epochs),
# which leave it saying nothing (measured at stop 72: tiny size, vocabulary 1000, embedded:forget10's 200 rows, one
# thread: final loss 6.00 and empty answers at the defaults; 0.49 and fluent answers in 23 s with these)
# the learning rate of every training from random weights: this, the embedded default's recipe
# (training/default_model.py), the TOFU-subset model (from_scratch.py) and the tests' small models
SCRATCH_LR = 3e-3
FIRST_TRAINING = dict(lr=SCRATCH_LR, epochs=100)
