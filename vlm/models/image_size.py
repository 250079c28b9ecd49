"""The core's two rules on image sizes, read from params.yaml's ``model:`` before any weight: the encoder's patch size
divides each side, and each side is a multiple of the patch size times ``model.pixel_shuffle``. The pack stage imports
this module and what it needs (SigLIP's config, the checkpoint reader), not the rest of the model code, so changing
the decoder, the connector or the perception does not re-pack the images."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vlm.config import ParamError, check
from vlm.models.pretrained import pretrained_config
from vlm.models.siglip import SiglipVisionConfig, siglip_config_from_pretrained

PIXEL_SHUFFLE = 1  # PaliGemma's: one image token per patch (PaliGemmaConfig.pixel_shuffle's default)
VISION = ("siglip", "none")  # PaliGemmaConfig.vision's values


def check_image_keys(model_section: Mapping[str, Any]) -> None:
    """The ``model:`` keys that the image size rules read, checked as the model checks them, so that a typo stops the
    pack stage before it packs, not the training after it."""
    vision = model_section.get("vision", "siglip")
    check(vision in VISION, "model.vision", f"must be one of {', '.join(map(repr, VISION))}, got {vision!r}")
    shuffle = model_section.get("pixel_shuffle", PIXEL_SHUFFLE)
    check(type(shuffle) is int and shuffle >= 1, "model.pixel_shuffle", f"must be an integer >= 1, got {shuffle!r}")
    patch_size = (model_section.get("siglip") or {}).get("patch_size", SiglipVisionConfig.patch_size)
    check(type(patch_size) is int and patch_size >= 1, "model.siglip.patch_size",
          f"must be an integer >= 1, got {patch_size!r}")


def encoder_patch_size(model_section: Mapping[str, Any]) -> tuple[Any, str] | None:
    """The encoder's patch size (``model.siglip``'s or ``model.vision_checkpoint``'s) and its key; None: blind."""
    if model_section.get("vision", "siglip") != "siglip":
        return None
    checkpoint = model_section.get("vision_checkpoint")
    if checkpoint is not None:
        patch_size = pretrained_config("vision_checkpoint", checkpoint, siglip_config_from_pretrained).patch_size
        return patch_size, "model.vision_checkpoint: its patch size"
    siglip = model_section.get("siglip") or {}
    return siglip.get("patch_size", SiglipVisionConfig.patch_size), "model.siglip.patch_size"


def check_image_size(model_section: Mapping[str, Any], image_size: int | tuple[int, int], source: str) -> None:
    """Raise a ``ParamError`` unless the encoder's patch size divides ``image_size`` (a side or ``(H, W)``, set where
    ``source`` says): the pack stage calls it, so an impossible ``pack.image_size`` fails before packing."""
    found = encoder_patch_size(model_section)
    if found is None:
        return
    patch_size, key = found
    for side in (image_size,) if isinstance(image_size, int) else image_size:
        if isinstance(patch_size, int) and patch_size > 0 and side % patch_size:
            raise ParamError(f"{key}: must divide {source} ({side} % {patch_size} = {side % patch_size})")


def image_side_multiple(model_section: Mapping[str, Any]) -> int:
    """What each side of the images must be a multiple of for the encoder and the connector: the patch size times
    ``model.pixel_shuffle`` (1 for the blind baseline). The pack stage rounds ``pack.aspect: native``'s width to it;
    for the Q-Former too, whose queries read every patch, so that switching the connector re-packs nothing (set
    ``model.pixel_shuffle: 1`` for the Q-Former's other sizes). The keys it reads are checked first."""
    check_image_keys(model_section)
    found = encoder_patch_size(model_section)
    if found is None:
        return 1
    return found[0] * model_section.get("pixel_shuffle", PIXEL_SHUFFLE)


def check_side_multiple(model_section: Mapping[str, Any], side: int, source: str) -> None:
    """Raise a ``ParamError`` unless ``side`` (set where ``source`` says) is a multiple of
    :func:`image_side_multiple`: the pack stage checks its height so, as it rounds its width (the linear
    connector's pixel shuffle needs whole groups of patches)."""
    multiple = image_side_multiple(model_section)
    if side % multiple:
        shuffle = model_section.get("pixel_shuffle", PIXEL_SHUFFLE)
        raise ParamError(f"{source}: must be a multiple of the patch size x model.pixel_shuffle ({multiple // shuffle} "
                         f"x {shuffle} = {multiple}), got {side}; or set model.pixel_shuffle: 1")
