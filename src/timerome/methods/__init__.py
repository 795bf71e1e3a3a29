"""Editing / unlearning methods behind one interface; each lives in its own file here.

    from timerome.methods import install, available
    from timerome.data.task import forget_task
    edit = install("timerome", backbone, forget_task(), {"alpha": 1.5}, seed=0)
    with edit.active():
        ...                      # the edited model
    edit.undo()                  # weight-changing methods put the weights back

Adding a method: a new file in this folder with one `@register("name", defaults=...)` function.
"""

from timerome.common.cost import measure
from timerome.methods.registry import (METHODS, Edit, InferenceEdit, Method, WeightEdit, available, get_method,
                                       install, method_config, register, weight_edit)
from timerome.data.task import ForgetTask

__all__ = ["METHODS", "Edit", "ForgetTask", "InferenceEdit", "Method", "WeightEdit", "available",
           "get_method", "install", "measure", "method_config", "register", "weight_edit"]
