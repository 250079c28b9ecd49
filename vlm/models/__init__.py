"""Models: SigLIP vision encoder, linear and Q-Former connectors, Gemma decoder, the PaliGemma-style VLM."""

from vlm.models.connector import LinearConnector
from vlm.models.gemma import CausalLMOutput, GemmaConfig, GemmaForCausalLM, GemmaModel, KVCache, prefix_lm_mask
from vlm.models.qformer import QFormerConfig, QFormerConnector, QFormerModel
from vlm.models.siglip import (
    SiglipVisionConfig,
    SiglipVisionModel,
    SiglipVisionOutput,
    load_pretrained_siglip,
    siglip_config_from_pretrained,
)
from vlm.models.vlm import TrafficVLM, VLMConfig, VLMOutput, build_vlm

__all__ = [
    "CausalLMOutput", "GemmaConfig", "GemmaForCausalLM", "GemmaModel", "KVCache", "LinearConnector",
    "QFormerConfig", "QFormerConnector", "QFormerModel", "SiglipVisionConfig", "SiglipVisionModel",
    "SiglipVisionOutput", "TrafficVLM", "VLMConfig", "VLMOutput", "build_vlm", "load_pretrained_siglip",
    "prefix_lm_mask", "siglip_config_from_pretrained",
]
