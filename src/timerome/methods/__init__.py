"""Editing / unlearning methods behind one interface; each lives in its own file here.

    from timerome.methods import install, available, ForgetTask
    edit = install("timerome", backbone, task, {"alpha": 2.0, "q": 4}, seed=0)
    with edit.active():
        ...                      # the edited model
    edit.undo()                  # weight-changing methods put the weights back

Adding a method: a new file in this folder with one `@register("name", defaults=...)` function.
"""

from timerome.methods.registry import (METHODS, Edit, ForgetTask, InferenceEdit, Method, WeightEdit,
                                       available, get_method, install, measure, method_config, register,
                                       weight_edit)

__all__ = ["METHODS", "Edit", "ForgetTask", "InferenceEdit", "Method", "WeightEdit", "available",
           "get_method", "install", "measure", "method_config", "register", "weight_edit"]
