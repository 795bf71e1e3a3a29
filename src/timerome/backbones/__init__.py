from timerome.backbones.backbone import POINTS, Backbone
from timerome.backbones.families import FAMILIES, HOOK_POINTS, Family, get_family
from timerome.backbones.loading import DEFAULT_MODEL_DIR, load_backbone

__all__ = ["Backbone", "Family", "FAMILIES", "HOOK_POINTS", "POINTS", "get_family", "load_backbone", "DEFAULT_MODEL_DIR"]
