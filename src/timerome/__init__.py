"""timerome: diffusion-time causal tracing and inference-time edit memory for masked diffusion LMs."""

from timerome.backbones import Backbone, load_backbone
from timerome.errors import TimeromeError
from timerome.hooks import Intervention, TraceState

__version__ = "0.1.0"
__all__ = ["Backbone", "load_backbone", "TimeromeError", "Intervention", "TraceState", "__version__"]
