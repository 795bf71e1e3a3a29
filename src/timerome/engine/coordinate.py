"""Coordinate: where an intervention acts, (layer, hook point, denoising step).

The paper's (l, m, k): block `layer`, hook `point` ("resid" = the block output, "attn" / "mlp" =
what those sub-layers add to the residual stream) and denoising step `step`. step None means
every step, which is what the paper always edits with (its k* = -1); -1 is read as None, so
"every step" has one spelling.

    Coordinate(1, "resid")                 layer 1, residual stream, every step
    Coordinate.of("1:resid:3")             the same at step 3 only
    Coordinate.of((1, "mlp")).on(backbone) checked against a model (negative layers count from the top)
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

from timerome.backbones.families import FAMILIES, HOOK_POINTS
from timerome.errors import TimeromeError

# the paper's three points, then the family-specific ones some models have (LLaDA-MoE's mlp_routed, ...)
KNOWN_POINTS = HOOK_POINTS + tuple(sorted({p for f in FAMILIES.values() for p, _ in f.extra_points}))


@dataclass(frozen=True)
class Coordinate:
    layer: int
    point: str = "resid"
    step: int | None = None  # None: every denoising step

    def __post_init__(self):
        if self.point not in KNOWN_POINTS:
            raise TimeromeError(f"unknown hook point {self.point!r}; a coordinate's point is one of "
                                f"{', '.join(KNOWN_POINTS)}")
        if isinstance(self.layer, bool) or not isinstance(self.layer, numbers.Integral):
            raise TimeromeError(f"layer must be an int, got {self.layer!r}")
        if self.step is not None and (isinstance(self.step, bool) or not isinstance(self.step, numbers.Integral)
                                      or self.step < -1):
            raise TimeromeError(f"step must be None, -1 (every step) or a step index >= 0, got {self.step!r}")
        object.__setattr__(self, "layer", int(self.layer))  # numpy ints too, and JSON-safe
        object.__setattr__(self, "step", None if self.step in (None, -1) else int(self.step))

    @classmethod
    def of(cls, value, step: int | None = None) -> "Coordinate":
        """A Coordinate from a Coordinate, a traced candidate (its every-step coordinate: the step
        where a fact is readable is not where the paper edits), (layer, point[, step]), a dict
        with those keys, or "layer:point[:step]"; `step` overrides."""
        if isinstance(value, Coordinate):
            c = value
        elif hasattr(value, "edit_coordinate"):
            c = value.edit_coordinate
        elif isinstance(value, dict):
            c = cls(value.get("layer"), value.get("point", "resid"), value.get("step"))
        elif isinstance(value, str):
            c = cls._parse(value)
        elif isinstance(value, (tuple, list)) and len(value) in (2, 3):
            c = cls(*value)
        else:
            raise TimeromeError(f"a coordinate is (layer, point) or (layer, point, step), got {value!r}")
        return c if step is None else dataclasses.replace(c, step=step)

    @classmethod
    def _parse(cls, text: str) -> "Coordinate":
        parts = text.strip().split(":")
        try:
            layer = int(parts[0])
            step = int(parts[2]) if len(parts) > 2 else None
        except ValueError:
            raise TimeromeError(f"a coordinate is written LAYER:POINT[:STEP] (e.g. 1:resid), got {text!r}") from None
        if len(parts) > 3:
            raise TimeromeError(f"a coordinate is written LAYER:POINT[:STEP] (e.g. 1:resid), got {text!r}")
        return cls(layer, parts[1] if len(parts) > 1 else "resid", step)

    def on(self, backbone) -> "Coordinate":
        """Checked against the backbone; a negative layer counts from the top."""
        n = backbone.n_layers
        if self.point not in getattr(backbone, "points", HOOK_POINTS):
            raise TimeromeError(f"the {backbone.family.name} model has no hook point {self.point!r}; its points are "
                                f"{', '.join(p for p in backbone.points if p != 'embed')}")
        if not -n <= self.layer < n:
            raise TimeromeError(f"layer {self.layer} out of range: the model has {n} layers")
        return dataclasses.replace(self, layer=self.layer % n)

    @property
    def site(self) -> tuple[int, str]:
        """(layer, point): the module the hook sits on."""
        return self.layer, self.point

    def every_step(self) -> "Coordinate":
        return dataclasses.replace(self, step=None)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return f"layer {self.layer} {self.point} (" + ("every step)" if self.step is None else f"step {self.step} only)")


def given_step(coordinate) -> int | None:
    """The denoising step a config's `coordinate` names (None: every step, no coordinate, or "traced", the
    rewrite memory's word for a traced gate)."""
    return None if coordinate in (None, "traced") else Coordinate.of(coordinate).step
