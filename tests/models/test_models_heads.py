"""The auxiliary vision heads (vlm.models.heads): one interface, checked options, their losses, what the
decoder reads, and nothing at all when they are off."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from vlm.data.grounding import FRAME_CHANNELS, GROUNDING_CHANNELS, HEAT_CHANNELS, PATCH_CHANNELS, head_layout
from vlm.models import SiglipVisionConfig, TrafficVLM, VLMConfig
from vlm.models.heads import HeadsConfig, VisionHeads
from vlm.models.heads.centres import NUM_COUNT_THRESHOLDS, STRIDE
from vlm.models.heads.grounding import FRAME_LOSS_WEIGHT, NUM_THRESHOLDS
from vlm.params import ParamError

STEM = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          image_size=32, patch_size=8, stem_channels=[8, 8, 16])


def heads(**options) -> HeadsConfig:
    return HeadsConfig(**{"loss_weight": 1.0, **options}, **head_layout())


def build(config, seed=0, **overrides) -> TrafficVLM:
    torch.manual_seed(seed)
    return TrafficVLM(config(**overrides))


def test_heads_off_is_plain_paligemma(config, make_batch):
    """No head: no parameter, no extra token, the connector reads the encoder's features only (the outputs
    match HuggingFace PaliGemma: test_models_vlm's parity test builds exactly this model)."""
    model = build(config)
    assert not any(name.startswith("heads.") for name in model.state_dict())
    assert list(model.heads.parameters()) == [] and model.heads.target_grid(32) is None
    assert model.multi_modal_projector.linear.in_features == model.config.siglip.hidden_size
    assert model.num_image_tokens == model.config.siglip.num_patches
    batch = make_batch(model.config)
    assert model(batch).aux_loss is None


@pytest.mark.parametrize("options, layout, message", [
    ({"loss_weight": -1.0}, {}, "model.heads.loss_weight: must be >= 0"),
    ({"grounding": True, "loss_weight": 0.0}, {}, "model.heads.loss_weight: must be > 0 with heads on"),
    ({"to_decoder": True}, {}, "model.heads.to_decoder: needs a head"),
    ({"centres": True, "loss_weight": 1.0}, {}, "model.heads.centres: needs a conv stem of at least 3 stages"),
    ({"grounding": True, "loss_weight": 1.0}, {"channels": []}, "model.heads.channels: must name the target"),
])
def test_options_are_checked_in_one_place(options, layout, message):
    values = {"heads": options, "siglip": {"patch_size": 16}}
    with pytest.raises(ParamError, match=message):
        VLMConfig.from_params(values, 57, 128, head_layout={**head_layout(), **layout})


def test_heads_need_vision_and_layout_comes_from_the_data():
    with pytest.raises(ParamError, match="model.heads: a model without vision"):
        VLMConfig.from_params({"vision": "none", "heads": {"grounding": True, "loss_weight": 1.0}}, 57, 128,
                              head_layout=head_layout())
    with pytest.raises(ParamError, match="model.heads.channels: set from the target layout"):
        VLMConfig.from_params({"heads": {"channels": ["box/car"]}}, 57, 128)
    config = VLMConfig.from_params({"heads": {"grounding": True, "loss_weight": 1.0}}, 57, 128,
                                   head_layout=head_layout())
    assert config.heads.channels == list(GROUNDING_CHANNELS)
    assert VLMConfig.from_dict(config.to_dict()) == config  # a checkpoint rebuilds its heads on its own


def test_grounding_loss_is_added_with_its_weight_and_trains_the_encoder(config, make_batch):
    model = build(config, heads=heads(grounding=True, loss_weight=2.0)).train()
    batch = make_batch(model.config)
    num_images, patches = batch.images.shape[0], model.config.siglip.num_patches
    assert model.heads.target_grid(32) == 4
    generator = torch.Generator().manual_seed(1)
    targets = (torch.rand(num_images, patches, len(GROUNDING_CHANNELS), generator=generator) > 0.8).float()
    is_count = torch.tensor([name.startswith("centre/") for name in GROUNDING_CHANNELS])
    targets[..., is_count] *= 2  # count channels may exceed 1
    frame_targets = torch.randint(-1, 2, (num_images, len(FRAME_CHANNELS)), generator=generator).float()
    frame_targets[0] = 1.0  # at least one defined attribute
    targets[..., -len(FRAME_CHANNELS):] = frame_targets[:, None]  # once per image, -1 = undefined
    plain = model(batch)
    grounded = model(replace(batch, targets=targets))
    features = model._vision(batch.images).last_hidden_state
    logits = model.heads.grounding(features)  # [N, P, C_head]
    patch, patch_targets = logits[..., :len(PATCH_CHANNELS)], targets[..., :len(PATCH_CHANNELS)]
    patch_count = is_count[:len(PATCH_CHANNELS)]
    binary = torch.nn.functional.binary_cross_entropy_with_logits(patch[..., ~patch_count],
                                                                  patch_targets[..., ~patch_count], reduction="sum")
    counts = (patch[..., patch_count].exp() - patch_targets[..., patch_count] * patch[..., patch_count]).sum()
    frame_logits = logits[..., -len(FRAME_CHANNELS):]
    assert torch.equal(frame_logits, frame_logits[:, :1].expand_as(frame_logits))  # one prediction per image
    known = frame_targets >= 0
    frame = torch.nn.functional.binary_cross_entropy_with_logits(frame_logits[:, 0][known], frame_targets[known])
    expected = (binary + counts) / patch_targets.numel() + FRAME_LOSS_WEIGHT * frame
    torch.testing.assert_close(grounded.aux_loss, expected)
    torch.testing.assert_close(grounded.loss, plain.loss + 2.0 * expected)
    assert plain.aux_loss is None
    assert model.num_image_tokens == model.config.siglip.num_patches  # to_decoder off: the decoder reads nothing
    grounded.loss.backward()
    assert model.heads.grounding.linear.weight.grad.abs().sum() > 0
    assert model.heads.grounding.frame.weight.grad.abs().sum() > 0
    assert model.vision_tower.embeddings.patch_embedding.weight.grad.abs().sum() > 0


def test_to_decoder_gives_the_connector_the_maps_and_one_token_their_totals(config, make_batch):
    model = build(config, heads=heads(grounding=True, to_decoder=True)).eval()
    head = model.heads.grounding
    num_maps = len(PATCH_CHANNELS) + len(FRAME_CHANNELS)
    assert VisionHeads.patch_width(model.config.heads) == num_maps
    assert model.multi_modal_projector.linear.in_features == model.config.siglip.hidden_size + num_maps
    assert model.num_image_tokens == model.config.siglip.num_patches + 1  # patch tokens, then the heads' token
    batch = make_batch(model.config)
    tokens, _ = model.encode_images(batch.images)
    assert tokens.shape == (batch.images.shape[0], model.num_image_tokens, model.config.gemma.hidden_size)
    logits = head(model._vision(batch.images).last_hidden_state)
    maps = head.maps(logits)
    torch.testing.assert_close(maps[..., ~head.is_count], logits[..., ~head.is_count].sigmoid())
    torch.testing.assert_close(maps[..., head.is_count], logits[..., head.is_count].exp())
    # totals thermometer-coded: an image total of 2.0 turns the codes for > 0.5 and > 1.5 on, the rest off
    codes = head.totals(torch.full((1, 4, num_maps), 0.5)).view(-1, NUM_THRESHOLDS)
    assert codes.shape == (len(PATCH_CHANNELS), NUM_THRESHOLDS)  # no frame totals
    assert (codes[:, :2] > 0.8).all() and (codes[:, 2:] < 0.2).all()
    model.train()(batch).loss.backward()  # the answers reach the grounding head through the maps
    assert head.linear.weight.grad.abs().sum() > 0


def test_centres_add_heatmaps_their_focal_loss_and_peak_counts(config, make_batch):
    model = build(config, siglip=STEM, heads=heads(grounding=True, centres=True, to_decoder=True)).train()
    centres = model.heads.centres
    batch = make_batch(model.config)
    cells = (32 // STRIDE) ** 2
    assert model.heads.target_grid(32) == 32 // STRIDE  # the finest grid any head reads
    targets = torch.zeros(batch.images.shape[0], cells, len(GROUNDING_CHANNELS))
    targets[0, 5, len(PATCH_CHANNELS) + 2] = 1.0  # one car centre in image 0
    vision = model._vision(batch.images)
    grounding_logits = model.heads.grounding(vision.last_hidden_state)
    heat = centres(vision.last_hidden_state, vision.stem_features)
    assert heat.shape == (batch.images.shape[0], cells, len(HEAT_CHANNELS))
    output = model(replace(batch, targets=targets))
    expected = model.heads.grounding.loss(grounding_logits, targets) + 0.1 * centres.loss(heat, targets)
    torch.testing.assert_close(output.aux_loss, expected)
    output.loss.backward()
    assert centres.out.weight.grad.abs().sum() > 0

    # two peaks above 0.5 in the left third of an 8 x 8 heatmap, one in the right third; a lower neighbour
    # of a peak is not a peak
    prob = torch.full((1, 8, 8, len(HEAT_CHANNELS)), 0.01)
    prob[0, 1, 0, 2], prob[0, 5, 1, 2], prob[0, 5, 2, 2], prob[0, 3, 7, 2] = 0.9, 0.8, 0.7, 0.6
    # footpoints count in the near part (rows below 0.6) of the left / straight / right paths
    vulnerable = HEAT_CHANNELS.index("foot/vulnerable")
    prob[0, 6, 3, vulnerable], prob[0, 2, 3, vulnerable] = 0.9, 0.9  # near, in left and straight; far
    counts = centres.peak_counts(torch.logit(prob.view(1, 64, -1)))
    assert counts.shape == (1, len(HEAT_CHANNELS), 3)
    assert counts[0, 2].tolist() == [3, 2, 1] and counts[0, :, 0].sum() == 3 + 1  # image, left third, right third
    assert counts[0, vulnerable].tolist() == [1, 1, 0]  # column 3.5 / 8 = 0.44: left and straight paths
    _, codes = centres.decoder_features(torch.logit(prob.view(1, 64, -1)))
    codes = codes.view(len(HEAT_CHANNELS), 3, -1)
    assert codes.shape[-1] == NUM_COUNT_THRESHOLDS and codes[2, 0].tolist()[:4] == [1, 1, 1, 0]
