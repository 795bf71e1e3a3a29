"""no_edit: the unedited model, the reference every paired test is taken against."""

from __future__ import annotations

from timerome.methods.registry import NO_EDIT, InferenceEdit, register


@register(NO_EDIT, deterministic=True, retain=False, saves=False)
def no_edit(backbone, task, config, seed):
    """The model as it is (reference row)."""
    return InferenceEdit(method=NO_EDIT, config=config)
