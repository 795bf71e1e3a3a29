"""random_layer: the TimeROME edit memory at a random (layer, module), a sanity check on tracing.

Same memory, same hyperparameters; only the coordinate is drawn (uniformly over layers and hook
points, from a CPU torch.Generator seeded with the seed: layer, then point) instead of traced.
`module` replaces the drawn point (the layer drawn is the same), `coordinate` replaces the draw.
"""

from __future__ import annotations

import dataclasses

import torch

from timerome.backbones import HOOK_POINTS
from timerome.engine.coordinate import Coordinate
from timerome.methods.registry import register
from timerome.methods.timerome_edit import DEFAULTS, check_step, memory_edit, whitened


def random_coordinate(n_layers: int, seed: int) -> tuple[int, str]:
    gen = torch.Generator().manual_seed(int(seed))
    layer = int(torch.randint(n_layers, (1,), generator=gen))
    return layer, HOOK_POINTS[int(torch.randint(len(HOOK_POINTS), (1,), generator=gen))]


@register("random_layer", defaults={k: v for k, v in DEFAULTS.items() if not k.startswith(("trace", "select"))},
          check=check_step, background=whitened, deterministic=lambda config: config["coordinate"] is not None)
def random_layer(backbone, task, config, seed):
    """TimeROME's memory at a random (layer, module) coordinate drawn with the seed."""
    step = config.get("step")
    coord = Coordinate.of(config["coordinate"] or random_coordinate(backbone.n_layers, seed))
    if config.get("module"):  # the point given, at the drawn (or given) layer and step, as timerome's `module` does
        coord = dataclasses.replace(coord, point=config["module"])
    coord = Coordinate.of(coord, None if step is None else int(step)).on(backbone)
    return memory_edit(backbone, task, config, coord, method="random_layer")
