"""The project's model: the PaliGemma core (:mod:`vlm.models`) with the traffic perception beside it
(:mod:`vlm.models.perception`; off: the plain core), built from the ``model:`` section of params.yaml."""

from dataclasses import dataclass, field

from vlm.config import check
from vlm.models.paligemma import PaliGemma, PaliGemmaConfig, load_pretrained
from vlm.models.perception import PerceptionConfig, TrafficPerception


@dataclass
class VLMConfig(PaliGemmaConfig):
    perception: PerceptionConfig = field(default_factory=PerceptionConfig)  # off = the plain PaliGemma core
    # when answering (val, evaluate, counterfactuals, predict; never in training), the mean of the answer
    # probabilities for the image and for its mirror image asked the left/right-swapped question (vlm.inference)
    mirror_answers: bool = False

    def validate(self, prefix: str = "model") -> None:
        super().validate(prefix)
        if self.vision == "siglip":
            self.perception.validate(f"{prefix}.perception", self.siglip.patch_size)
        else:
            check(not self.perception.enabled, f"{prefix}.perception",
                  "a model without vision (vision: none) has no image to perceive: turn it off")
            check(not self.mirror_answers, f"{prefix}.mirror_answers",
                  "a model without vision (vision: none) has no image to mirror: turn it off")


def build_vlm(config: VLMConfig, pretrained: bool = True) -> PaliGemma:
    """The model of ``config``: the core, given the perception when it is on; with ``pretrained`` (to train) the
    encoder and decoder start from ``vision_checkpoint`` / ``decoder_checkpoint`` where set."""
    extension = TrafficPerception(config.perception, config.siglip, config.gemma.hidden_size) \
        if config.perception.enabled else None
    model = PaliGemma(config, extension)
    return load_pretrained(model) if pretrained else model
