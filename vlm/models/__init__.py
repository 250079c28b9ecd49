"""The PaliGemma core: SigLIP encoder, linear and Q-Former connectors, Gemma decoder, the prefix-LM VLM and the one
interface a task extends it through (:mod:`vlm.models.extension`); it never imports :mod:`vlm.models.perception`."""

from vlm.models.connector import LinearConnector
from vlm.models.extension import ExtensionOutput, VisionExtension
from vlm.models.gemma import GemmaConfig, GemmaForCausalLM, GemmaModel, KVCache, prefix_lm_mask
from vlm.models.paligemma import PaliGemma, PaliGemmaConfig, VLMOutput, load_pretrained
from vlm.models.qformer import QFormerConfig, QFormerConnector, QFormerModel
from vlm.models.siglip import (
    SiglipVisionConfig,
    SiglipVisionModel,
    SiglipVisionOutput,
    load_pretrained_siglip,
    siglip_config_from_pretrained,
)

__all__ = [
    "ExtensionOutput", "GemmaConfig", "GemmaForCausalLM", "GemmaModel", "KVCache", "LinearConnector", "PaliGemma",
    "PaliGemmaConfig", "QFormerConfig", "QFormerConnector", "QFormerModel", "SiglipVisionConfig", "SiglipVisionModel",
    "SiglipVisionOutput", "VLMOutput", "VisionExtension", "load_pretrained", "load_pretrained_siglip",
    "prefix_lm_mask", "siglip_config_from_pretrained",
]
