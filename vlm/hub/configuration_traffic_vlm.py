"""config.json of an exported model: the project's model config and what answering needs beside the weights."""

from typing import Any

from transformers import PretrainedConfig


class TrafficVLMConfig(PretrainedConfig):
    model_type = "traffic_vlm"

    def __init__(self, vlm: dict[str, Any] | None = None, answers: list[str] | None = None,
                 candidates: list[list[int]] | None = None, templates: list[dict[str, Any]] | None = None,
                 image: dict[str, Any] | None = None, **kwargs):
        self.vlm = vlm or {}  # the model: VLMConfig.to_dict() (vlm/traffic_vlm.py)
        self.answers = answers or []  # every answer the model gives
        self.candidates = candidates or []  # each answer's token ids, [EOS] included: what constrained decoding scores
        # per question template: "patterns", the regular expressions (any case) of its phrasings, no question mark;
        # "phrasings", to name the closest to a question of none; "answers", those its rule can give
        self.templates = templates or []
        # how an image file becomes the model's pixels (vlm.data.image.decode_image): "height", "width",
        # "resample", "aspect"
        self.image = image or {}
        super().__init__(**kwargs)
