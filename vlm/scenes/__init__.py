"""Traffic scenes: the normalised scene record, the BDD100K reader and the synthetic renderer."""

from vlm.scenes.schema import CATEGORIES, LIGHT_COLORS, Scene, SceneObject

__all__ = ["CATEGORIES", "LIGHT_COLORS", "Scene", "SceneObject"]
