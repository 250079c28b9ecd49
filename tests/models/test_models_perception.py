"""The traffic perception beside the core (vlm.models.perception): the extension interface, the conv stem
adapter, the heads (one interface, checked options, their losses, what the decoder reads), and nothing at all
when it is off."""

from __future__ import annotations

import math
from dataclasses import fields, replace

import pytest
import torch

from vlm.config import ParamError
from vlm.models.paligemma import PaliGemma
from vlm.models.perception import PerceptionConfig, TrafficPerception, head_metrics
from vlm.models.perception.heads import HEADS, AuxiliaryHead
from vlm.models.perception.heads.centres import NUM_COUNT_THRESHOLDS
from vlm.models.perception.heads.counts import MAX_LOG_COUNT, WINDOW
from vlm.models.perception.heads.grounding import FRAME_LOSS_WEIGHT, NUM_THRESHOLDS
from vlm.models.perception.stem import PYRAMID_WIDTH, StemPyramid
from vlm.models.perception.targets import CHANNELS, GROUPS, channels
from vlm.models.siglip import SiglipVisionConfig
from vlm.traffic_vlm import VLMConfig, build_vlm

NUM_PATCH = len(GROUPS["box"] + GROUPS["centre"] + GROUPS["light"] + GROUPS["occluded"])
HEAT_CHANNELS = GROUPS["heat"] + GROUPS["foot"]
STRIDE = 4  # model.perception.fine_stride's default
STEM = [8, 8, 16]  # 3 stride-2 stages = the tiny encoder's patch size 8


def build(config, seed=0, core: dict | None = None, **perception) -> PaliGemma:
    """The tiny core config of conftest (``core`` over it) with the perception ``perception`` gives."""
    torch.manual_seed(seed)
    core = config(**(core or {}))
    return build_vlm(VLMConfig(**{f.name: getattr(core, f.name) for f in fields(core)},
                               perception=PerceptionConfig(**perception)), pretrained=False)


def vision(model: PaliGemma, images: torch.Tensor):
    """The encoder's patch features and the stem's stage outputs, as the core computes them."""
    pixel_values = torch.addcmul(model.pixel_shift, images.float(), model.pixel_scale)
    residual, state = model.extension.adapt(pixel_values)
    fine = None if model.extension.pyramid is None else model.extension.pyramid(state[0])  # the fine heads' input
    return model.vision_tower(pixel_values, patch_residual=residual).last_hidden_state, fine


def test_perception_off_is_the_plain_core(config, make_batch):
    """No stem, no head: no extension at all, the very model the HF parity tests check."""
    model = build(config)
    assert model.extension is None
    assert set(model.state_dict()) == set(PaliGemma(config()).state_dict())
    assert model(make_batch(model.config)).losses.keys() == {"answer"}


@pytest.mark.parametrize("perception, message", [
    ({"heads": {"grounding": -1.0}}, r"model.perception.heads.grounding: must be a loss weight >= 0"),
    ({"heads": {"nope": 1.0}}, r"model.perception.heads.nope: unknown head \(known: "),
    ({"to_decoder": True}, "model.perception.to_decoder: needs a head"),
    ({"heads": {"grounding": 1.0}, "mirror_average": True},
     r"model.perception.mirror_average: needs a head that averages over the mirror image \(counts\)"),
    ({"heads": {"grounding": 1.0, "centres": 1.0}}, "model.perception.heads.centres: needs a conv stem of at least 3"),
    ({"stem_channels": [4, 8]}, r"model.perception.stem_channels: 2 stride-2 stages reduce by 4, not by the patch "
                                r"size \(16\)"),
    ({"fine_stride": 6}, r"model.perception.fine_stride: must be a power of two >= 2 \(a stem stage's stride\), got 6"),
    ({"stem_channels": [4, 8, 8, 8], "heads": {"counts": 1.0}, "fine_stride": 16},
     r"model.perception.heads.counts: needs a conv stem of at least 5 stages at model.perception.fine_stride 16"),
])
def test_options_are_checked_in_one_place(perception, message):
    with pytest.raises(ParamError, match=message):
        VLMConfig.from_params({"perception": perception, "siglip": {"patch_size": 16}}, 57, 128)


def test_perception_needs_vision_and_a_checkpoint_rebuilds_it():
    with pytest.raises(ParamError, match="model.perception: a model without vision"):
        VLMConfig.from_params({"vision": "none", "perception": {"heads": {"grounding": 1.0}}}, 57, 128)
    config = VLMConfig.from_params({"perception": {"heads": {"grounding": 1.0, "centres": 0.0}}}, 57, 128)
    assert config.perception.active_heads == ["grounding"]  # weight 0: off
    assert VLMConfig.from_dict(config.to_dict()) == config


def test_a_head_is_one_file_that_registers_itself(tmp_path):
    """Every module of the heads package is imported and each AuxiliaryHead subclass joins HEADS by its name."""
    assert {"grounding", "centres", "counts"} <= set(HEADS)
    assert all(issubclass(cls, AuxiliaryHead) and cls.name == name for name, cls in HEADS.items())

    class Probe(AuxiliaryHead):
        name = "probe"

    try:
        assert HEADS["probe"] is Probe
        PerceptionConfig(heads={"probe": 1.0}).validate()
    finally:
        del HEADS["probe"]


def test_the_target_schema_names_each_channel_once():
    assert len(CHANNELS) == len(set(CHANNELS)) == sum(len(g) for g in GROUPS.values())
    assert CHANNELS[channels("heat", "foot")] == HEAT_CHANNELS
    with pytest.raises(ValueError, match="not consecutive"):
        channels("box", "light")


def test_conv_stem_adds_to_the_patch_embedding_and_learns(config, make_batch):
    model = build(config, stem_channels=STEM).train()
    batch = make_batch(model.config)
    model(batch).losses["answer"].backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    stem = model.extension.stem
    with torch.no_grad():  # without the stem's contribution, the core alone remains
        stem.proj.weight.zero_()
        stem.proj.bias.zero_()
    plain = PaliGemma(config())
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("extension.")})
    torch.testing.assert_close(model.eval()(batch).logits, plain.eval()(batch).logits)


def grounding_targets(num_images: int, cells: int, generator: torch.Generator) -> torch.Tensor:
    """Random targets ``[N, cells, C]``: 0/1 maps, counts up to 2, frame attributes once per image (-1 unknown)."""
    targets = (torch.rand(num_images, cells, len(CHANNELS), generator=generator) > 0.8).float()
    targets[..., channels("centre")] *= 2  # count channels may exceed 1
    frame_targets = torch.randint(-1, 2, (num_images, len(GROUPS["frame"])), generator=generator).float()
    frame_targets[0] = 1.0  # at least one defined attribute
    targets[..., channels("frame")] = frame_targets[:, None]
    return targets


def test_grounding_loss_is_its_own_entry_and_trains_the_encoder(config, make_batch):
    model = build(config, heads={"grounding": 2.0}).train()
    batch = make_batch(model.config)
    num_images, patches = batch.images.shape[0], model.config.siglip.num_patches
    assert model.extension.targets(32, (1280, 720)).grid == 4
    assert model.loss_weights == {"answer": 1.0, "grounding": 2.0}
    targets = grounding_targets(num_images, patches, torch.Generator().manual_seed(1))
    plain = model(batch)
    grounded = model(replace(batch, targets=targets))
    logits = model.extension.heads["grounding"](vision(model, batch.images)[0], None)  # [N, P, C_head]
    patch, patch_targets = logits[..., :NUM_PATCH], targets[..., :NUM_PATCH]
    is_count = torch.tensor([name in GROUPS["centre"] for name in CHANNELS[:NUM_PATCH]])
    binary = torch.nn.functional.binary_cross_entropy_with_logits(patch[..., ~is_count], patch_targets[..., ~is_count],
                                                                  reduction="sum")
    counts = (patch[..., is_count].exp() - patch_targets[..., is_count] * patch[..., is_count]).sum()
    frame_logits = logits[..., NUM_PATCH:]
    assert torch.equal(frame_logits, frame_logits[:, :1].expand_as(frame_logits))  # one prediction per image
    frame_targets = targets[:, 0, channels("frame")]
    known = frame_targets >= 0
    frame = torch.nn.functional.binary_cross_entropy_with_logits(frame_logits[:, 0][known], frame_targets[known])
    expected = (binary + counts) / patch_targets.numel() + FRAME_LOSS_WEIGHT * frame
    assert plain.losses.keys() == {"answer"} and grounded.losses.keys() == {"answer", "grounding"}
    torch.testing.assert_close(grounded.losses["grounding"], expected)  # unweighted: training weights it
    torch.testing.assert_close(grounded.losses["answer"], plain.losses["answer"])
    assert model.num_image_tokens == model.config.siglip.num_patches  # to_decoder off: the decoder reads nothing
    grounded.losses["grounding"].backward()
    head = model.extension.heads["grounding"]
    assert head.linear.weight.grad.abs().sum() > 0 and head.frame.weight.grad.abs().sum() > 0
    assert model.vision_tower.embeddings.patch_embedding.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("perception", [
    {"heads": {"grounding": 1.0}, "to_decoder": True},
    {"stem_channels": STEM, "heads": {"grounding": 1.0, "centres": 0.5, "counts": 1.0}, "to_decoder": True},
    {"stem_channels": STEM, "heads": {"counts": 1.0}, "to_decoder": False},
], ids=["grounding", "every head", "not to the decoder"])
@pytest.mark.parametrize("connector", ["linear", "qformer"])
def test_the_packed_layout_has_a_slot_for_each_image_token(config, make_batch, perception, connector):
    """The packed rows are laid out from ``num_image_tokens`` before the image tokens exist (so that on a GPU the
    layout's reads wait for nothing): every extension's tokens are in that count."""
    model = build(config, core={"pack_questions": True, "connector": connector}, **perception).eval()
    batch = make_batch(model.config)
    tokens, _ = model.encode_images(batch.images)
    assert tokens.shape[1] == model.num_image_tokens
    assert (model.num_image_tokens > model.config.num_image_tokens) == perception["to_decoder"]  # the heads' tokens
    assert model(batch).logits.shape[:2] == batch.input_ids.shape


def test_to_decoder_gives_the_connector_the_maps_and_one_token_their_totals(config, make_batch):
    model = build(config, heads={"grounding": 1.0}, to_decoder=True).eval()
    head = model.extension.heads["grounding"]
    num_maps = NUM_PATCH + len(GROUPS["frame"])
    assert model.extension.patch_width == head.patch_width == num_maps
    assert model.multi_modal_projector.linear.in_features == model.config.siglip.hidden_size + num_maps
    lights = len(GROUPS["light"])
    # patch tokens, then the heads' shared token and a token per light colour
    assert model.num_image_tokens == model.config.siglip.num_patches + 1 + lights
    batch = make_batch(model.config)
    tokens, _ = model.encode_images(batch.images)
    assert tokens.shape == (batch.images.shape[0], model.num_image_tokens, model.config.gemma.hidden_size)
    logits = head(vision(model, batch.images)[0], None)
    red = logits.new_full(logits.shape, -30.0)
    red[0, [1, 2], CHANNELS[head.patch_channels].index("light/red")] = 30.0  # a red light over two patches
    expected = torch.tensor([[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]])  # per colour: highest probability, total
    torch.testing.assert_close(head.tokens(red)[0], expected, atol=1e-6, rtol=0)
    maps = head.maps(logits)
    torch.testing.assert_close(maps[..., ~head.is_count], logits[..., ~head.is_count].sigmoid())
    torch.testing.assert_close(maps[..., head.is_count], logits[..., head.is_count].exp())
    # totals thermometer-coded: an image total of 2.0 turns the codes for > 0.5 and > 1.5 on, the rest off
    codes = head.totals(torch.full((1, 4, num_maps), 0.5)).view(-1, NUM_THRESHOLDS)
    assert codes.shape == (NUM_PATCH, NUM_THRESHOLDS)  # no frame totals
    assert (codes[:, :2] > 0.8).all() and (codes[:, 2:] < 0.2).all()
    model.train()(batch).losses["answer"].backward()  # the answers reach the grounding head through the maps
    assert head.linear.weight.grad.abs().sum() > 0


def test_centres_add_heatmaps_their_focal_loss_and_peak_counts(config, make_batch):
    model = build(config, stem_channels=STEM, heads={"grounding": 1.0, "centres": 0.1}, to_decoder=True).train()
    centres = model.extension.heads["centres"]
    batch = make_batch(model.config)
    cells = (32 // STRIDE) ** 2
    assert model.extension.targets(32, (1280, 720)).grid == 32 // STRIDE  # the finest grid any head reads
    targets = torch.zeros(batch.images.shape[0], cells, len(CHANNELS))
    targets[0, 5, CHANNELS.index("heat/car")] = 1.0  # one car centre in image 0
    features, fine = vision(model, batch.images)
    heat = centres(features, fine)
    assert heat.shape == (batch.images.shape[0], cells, len(HEAT_CHANNELS))
    output = model(replace(batch, targets=targets))
    torch.testing.assert_close(output.losses["centres"], centres.loss(heat, targets))
    assert model.loss_weights == {"answer": 1.0, "grounding": 1.0, "centres": 0.1}
    output.losses["centres"].backward()
    assert centres.out.weight.grad.abs().sum() > 0 and model.extension.pyramid.lateral.weight.grad.abs().sum() > 0

    # two peaks above 0.5 in the left third of an 8 x 8 heatmap, one in the right third; a lower neighbour
    # of a peak is not a peak
    car = HEAT_CHANNELS.index("heat/car")
    prob = torch.full((1, 8, 8, len(HEAT_CHANNELS)), 0.01)
    prob[0, 1, 0, car], prob[0, 5, 1, car], prob[0, 5, 2, car], prob[0, 3, 7, car] = 0.9, 0.8, 0.7, 0.6
    # footpoints count in the near part (rows below 0.6) of the left / straight / right paths
    vulnerable = HEAT_CHANNELS.index("foot/vulnerable")
    prob[0, 6, 3, vulnerable], prob[0, 2, 3, vulnerable] = 0.9, 0.9  # near, in left and straight; far
    counts = centres.peak_counts(torch.logit(prob.view(1, 64, -1)))
    assert counts.shape == (1, len(HEAT_CHANNELS), 3)
    assert counts[0, car].tolist() == [3, 2, 1] and counts[0, :, 0].sum() == 3 + 1  # image, left third, right third
    assert counts[0, vulnerable].tolist() == [1, 1, 0]  # column 3.5 / 8 = 0.44: left and straight paths
    _, codes = centres.decoder_features(torch.logit(prob.view(1, 64, -1)))
    codes = codes.view(len(HEAT_CHANNELS), 3, -1)
    assert codes.shape[-1] == NUM_COUNT_THRESHOLDS and codes[car, 0].tolist()[:4] == [1, 1, 1, 0]



def test_the_lights_read_the_fine_map_each_patch_its_highest_cell(config, make_batch):
    """A lit lamp is a pixel or two of a patch: with a fine head on, the grounding head's light logits add a
    3 x 3 convolution of the stem's fine map, its highest cell in each patch: one fine cell moves the lights of the
    patches within a cell of it, and nothing else."""
    model = build(config, stem_channels=STEM, heads={"grounding": 1.0, "centres": 0.1})
    grounding = model.extension.heads["grounding"]
    features, fine = vision(model, make_batch(model.config).images)
    lights = channels("light")
    with torch.no_grad():
        grounding.fine_lights.bias.fill_(-5.0)
        base = grounding(features, fine)
        brighter = fine.clone()
        brighter[0, :, 2, 3] += 100.0  # one cell of image 0's 8 x 8 fine map (2 x 2 cells a patch of 4 x 4)
        moved = grounding(features, brighter)
    changed = (moved - base).abs().sum(-1) > 0  # [N, P]
    # cells rows 1-3, columns 2-4: patch rows 0-1, columns 1-2
    assert changed[0].nonzero().flatten().tolist() == [1, 2, 5, 6] and not changed[1:].any()
    assert torch.equal(moved[..., :lights.start], base[..., :lights.start])  # the other channels: the patches alone
    assert build(config, stem_channels=STEM, heads={"grounding": 1.0}).extension.heads["grounding"].fine_lights is None


def test_the_perception_is_an_extension_of_the_core():
    perception = TrafficPerception(PerceptionConfig(heads={"grounding": 1.0}, to_decoder=True),
                                   SiglipVisionConfig(hidden_size=32, num_attention_heads=2, image_size=32,
                                                      patch_size=8), text_hidden_size=16)
    assert perception.num_tokens == 1 + len(GROUPS["light"]) and perception.loss_weights == {"grounding": 1.0}


def test_the_worked_example_of_docs_architecture_adds_a_head(config, make_batch):
    """docs/architecture.md's "Adding a head" example, run as written: one file's code and a config entry give a
    head that the model builds, whose loss the loss dict carries and which learns."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text(encoding="utf-8")
    example = docs.split("### Adding a head")[1].split("```python\n")[1].split("```")[0]
    try:
        exec(compile(example, "red_light.py", "exec"), {"__name__": "vlm.models.perception.heads.red_light"})
        model = build(config, heads={"red_light": 1.0}).train()
        batch = make_batch(model.config)
        targets = torch.zeros(batch.images.shape[0], model.config.siglip.num_patches, len(CHANNELS))
        targets[0, 3, CHANNELS.index("light/red")] = 1.0
        output = model(replace(batch, targets=targets))
        assert output.losses.keys() == {"answer", "red_light"} and model.loss_weights["red_light"] == 1.0
        output.losses["red_light"].backward()
        assert model.extension.heads["red_light"].linear.weight.grad.abs().sum() > 0
    finally:
        HEADS.pop("red_light", None)


@pytest.mark.parametrize("image_width", [None, 64])
def test_the_fine_map_is_32_wide_whatever_the_image_and_computed_once(config, image_width):
    """The stride-4 map the centres and counts heads read is PYRAMID_WIDTH channels wide whatever the image's
    width (a shadowed name once made the centre head's convolutions as wide as the image), built once for both."""
    core = config()
    vision_config = replace(core.siglip, image_width=image_width)
    perception = TrafficPerception(PerceptionConfig(stem_channels=STEM, heads={"centres": 1.0, "counts": 1.0}),
                                   vision_config, text_hidden_size=16)
    widths = {m.out_channels for m in perception.pyramid.modules() if isinstance(m, torch.nn.Conv2d)}
    assert widths - {STEM[2]} == {PYRAMID_WIDTH}  # the lateral 1x1 projects to the stride-8 stage's channels
    assert not [m for m in perception.heads.modules() if isinstance(m, StemPyramid)]
    rows, columns = vision_config.height_width
    assert perception.heads["centres"].grid == perception.heads["counts"].grid == (rows // STRIDE, columns // STRIDE)


@pytest.mark.parametrize("fine_stride", [2, 4, 8])
def test_the_fine_map_has_the_cells_of_its_stride(config, fine_stride):
    """``model.perception.fine_stride``: the pyramid reads the stem's stages of that stride and twice it, and the fine
    heads and their targets share its grid; at 4 with the default 4-stage stem, the second and third stages."""
    stem = [4, 8, 8, 8, 8]  # 32 px patches: stages of stride 2 to 32
    vision_config = replace(config().siglip, image_size=64, image_width=128, patch_size=32)
    perception = TrafficPerception(PerceptionConfig(stem_channels=stem, heads={"centres": 1.0, "counts": 1.0},
                                                    fine_stride=fine_stride), vision_config, text_hidden_size=16)
    grid = (64 // fine_stride, 128 // fine_stride)
    assert perception.heads["centres"].grid == perception.heads["counts"].grid == grid
    assert perception.targets((64, 128), (1280, 720)).grid == grid
    _, stages = perception.stem(torch.zeros(1, 3, 64, 128))
    assert perception.pyramid(stages).shape == (1, PYRAMID_WIDTH, *grid)
    assert StemPyramid(STEM, PYRAMID_WIDTH).index == 1  # the default, stride 4: the second stage


def test_counts_are_region_sums_of_a_density_the_losses_and_the_answer_reach(config, make_batch):
    """The counts head's region sums are its density summed over each channel's regions; its loss falls to the
    Poisson minimum at the exact counts; the decoder reads them as one token per channel, not detached."""
    model = build(config, stem_channels=STEM, heads={"grounding": 1.0, "counts": 1.0}, to_decoder=True).train()
    head = model.extension.heads["counts"]
    num_channels = len(GROUPS["centre"]) + len(GROUPS["feet"])
    assert head.token_shape == (num_channels, 3 * NUM_THRESHOLDS)
    assert model.num_image_tokens == model.config.siglip.num_patches + 1 + len(GROUPS["light"]) + num_channels
    rows, columns = head.grid  # 8 x 8 cells
    batch = make_batch(model.config)
    targets = torch.zeros(batch.images.shape[0], rows * columns, len(CHANNELS))
    car, vulnerable = CHANNELS.index("centre/car"), CHANNELS.index("feet/vulnerable")
    targets[0, 1 * columns + 0, car] = 2.0  # two cars in one cell of the left third
    targets[0, 3 * columns + 7, car] = 1.0  # one in the right third
    targets[1, 6 * columns + 3, vulnerable] = 1.0  # a pedestrian's footpoint, near: the left and straight paths
    counts = torch.cat([targets[..., channels("centre")], targets[..., channels("feet")]], dim=-1)
    sums = head.region_sums(counts)  # [N, C, R]
    car_index, vulnerable_index = GROUPS["centre"].index("centre/car"), num_channels - 2
    assert sums[0, car_index].tolist() == [3, 2, 1] and sums[1, vulnerable_index].tolist() == [1, 1, 0]
    assert sums.sum() == 3 + 2 + 1 + 1 + 1  # nothing counted outside the regions
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as on CUDA: bf16 would round 6.51 to 6.5
        fine = head.region_sums(counts + 0.0013)  # 0.0013 x each region's cells added
    assert fine.dtype == torch.float32
    torch.testing.assert_close(fine, sums + 0.0013 * head.masks.flatten(2).sum(-1))
    windows = head.window_sums(counts)[0, car_index]  # [rows, columns]: the cars within WINDOW // 2 cells
    assert windows[1, 0] == 2 and windows[1, WINDOW // 2] == 2 and windows[1, WINDOW // 2 + 1] == 0
    assert windows[3, 7] == 1 and windows[3, 7 - WINDOW // 2] == 1 and windows[3 + WINDOW // 2 + 1, 7] == 0

    # at the exact counts (log-density log(count) where there are objects, very low elsewhere) the region term
    # is the Poisson minimum and every region count is exact
    perfect = torch.where(counts > 0, counts.clamp(min=1e-9).log(), torch.full_like(counts, -30.0))
    exact = head.metrics(perfect, targets)  # per image: the share of exact region counts, all of them exact
    assert exact["counts/exact"].tolist() == exact["counts/all_exact"].tolist() == [1.0] * targets.shape[0]
    assert head.loss(perfect, targets) < head.loss(perfect + 0.5, targets)
    doubled = head.metrics(perfect.clamp(max=MAX_LOG_COUNT) + math.log(2), targets)  # every count twice
    assert doubled["counts/all_exact"].tolist() == [0.0, 0.0, 1.0]  # image 2 has no object: twice nothing is nothing
    assert doubled["counts/exact"][0] == pytest.approx(1 - 3 / (num_channels * 3))  # image 0: its 3 car counts off
    features, fine = vision(model, batch.images)
    measures = head_metrics(model, batch.images, targets)  # through the core's encoder, the decoder left out
    torch.testing.assert_close(measures["counts/exact"], head.metrics(head(features, fine), targets)["counts/exact"])

    model(replace(batch, targets=targets)).losses["answer"].backward()
    assert head.out[-1].weight.grad.abs().sum() > 0  # the answer's loss reaches the density
    assert model.extension.head_tokens["counts"].embedding.grad.abs().sum() > 0


def test_a_mirror_averaged_head_reads_the_fine_map():
    """Mirror averaging runs the mirror image through the stem and its fine map: a head that reads only the patch
    features cannot declare it."""
    with pytest.raises(TypeError, match="Patchy: mirror_averaged needs reads_fine"):
        type("Patchy", (AuxiliaryHead,), {"name": "patchy", "mirror_averaged": True})
    assert "patchy" not in HEADS


def test_mirror_average_makes_the_counts_mirror_equivariant_in_evaluation_only(config, make_batch):
    """``model.perception.mirror_average``: in evaluation the counts head's density is the mean of the image's and its
    mirror image's (mirrored back), so mirroring the image swaps its left and right region counts exactly; in
    training it is the plain head, the same weights giving the same logits and losses."""
    plain = build(config, stem_channels=STEM, heads={"centres": 1.0, "counts": 1.0}, to_decoder=True)
    model = build(config, stem_channels=STEM, heads={"centres": 1.0, "counts": 1.0}, to_decoder=True,
                  mirror_average=True)
    images = make_batch(model.config).images
    head = model.extension.heads["counts"]

    def logits(m, pixels):
        pixel_values = torch.addcmul(m.pixel_shift, pixels.float(), m.pixel_scale)
        residual, state = m.extension.adapt(pixel_values)
        return m.extension.head_logits(m.vision_tower(pixel_values, patch_residual=residual).last_hidden_state, state)

    with torch.no_grad():
        trained = logits(model.train(), images)
        for name, value in logits(plain.train(), images).items():
            torch.testing.assert_close(trained[name], value, rtol=0, atol=0)  # training: the plain heads
        plain_eval, averaged = logits(plain.eval(), images)["counts"], logits(model.eval(), images)["counts"]
        mirrored = logits(model, images.flip(-1))["counts"]
    assert not torch.allclose(averaged, plain_eval)
    sums, sums_mirrored = head.region_sums(head.density(averaged)), head.region_sums(head.density(mirrored))
    centre = slice(0, len(GROUPS["centre"]))  # regions: the image, its left third, its right third
    torch.testing.assert_close(sums_mirrored[:, centre], sums[:, centre][..., [0, 2, 1]])
    feet = slice(len(GROUPS["centre"]), None)  # regions: the paths to turn left, go straight, turn right
    torch.testing.assert_close(sums_mirrored[:, feet], sums[:, feet][..., [2, 1, 0]])
    unaveraged = head.region_sums(head.density(logits(plain, images.flip(-1))["counts"]))
    plain_sums = head.region_sums(head.density(plain_eval))
    assert not torch.allclose(unaveraged[:, centre], plain_sums[:, centre][..., [0, 2, 1]])  # without: not exact


def test_the_oracle_probe_reads_the_label_maps_not_the_heads(config, make_batch, perturb):
    """``model.perception.oracle``: every head's part of the image tokens comes from ``Batch.targets`` (exact
    region counts, peaks at the labelled centres, the labelled lights), whatever the heads predict, when training
    and when answering; a batch without targets stops it."""
    model = build(config, stem_channels=STEM, heads={"grounding": 1.0, "centres": 0.1, "counts": 1.0},
                  to_decoder=True, oracle=True).eval()
    heads = model.extension.heads
    batch = make_batch(model.config)
    rows, columns = heads["counts"].grid  # the targets' 8 x 8 cells; the 4 x 4 patches are 2 x 2 cells each
    targets = torch.zeros(batch.images.shape[0], rows * columns, len(CHANNELS))
    for cell, cars in ((1 * columns + 0, 2.0), (3 * columns + 7, 1.0)):  # two cars in a left cell, one right
        targets[0, cell, CHANNELS.index("centre/car")] = cars
        targets[0, cell, CHANNELS.index("heat/car")] = 1.0
    targets[0, [0, 1], CHANNELS.index("light/red")] = 1.0  # a red light in the first patch
    counts = heads["counts"]
    sums = counts.region_sums(counts.density(counts.oracle(targets)))  # [N, C, R]
    torch.testing.assert_close(sums, counts.region_sums(counts.counts(targets)), atol=1e-3, rtol=0)
    car = HEAT_CHANNELS.index("heat/car")
    assert heads["centres"].peak_counts(heads["centres"].oracle(targets))[0, car].tolist() == [2, 1, 1]
    lights = heads["grounding"].tokens(heads["grounding"].oracle(targets))  # [N, colour, (highest, total)]
    torch.testing.assert_close(lights[0], torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]), atol=1e-6, rtol=0)

    patches = model.config.num_image_tokens  # the connector's tokens read the encoder too; the heads' come after
    before = model.encode_images(batch.images, targets)[0][:, patches:]
    perturb(model.extension.heads, std=1.0)
    torch.testing.assert_close(model.encode_images(batch.images, targets)[0][:, patches:], before)
    assert model.train()(replace(batch, targets=targets)).losses.keys() == {"answer", "grounding", "centres", "counts"}
    assert model.eval().answer(replace(batch, targets=targets), [[3], [4]]).shape == (batch.input_ids.shape[0], 2)
    with pytest.raises(ValueError, match="model.perception.oracle: .* no targets"):
        model.answer(batch, [[3], [4]])
    with pytest.raises(ParamError, match="model.perception.oracle: .* needs model.perception.to_decoder: true"):
        PerceptionConfig(heads={"grounding": 1.0}, oracle=True).validate()


def test_label_maps_in_training_are_read_in_training_and_the_heads_when_answering(config, make_batch, perturb):
    """``label_maps_in_training``: training's image tokens come from ``Batch.targets`` whatever the heads predict (as
    the oracle's); answering, from the heads' predictions, with no targets needed."""
    model = build(config, stem_channels=STEM, heads={"grounding": 1.0, "centres": 0.1, "counts": 1.0},
                  to_decoder=True, label_maps_in_training=True)
    assert not model.extension.reads_targets  # answering needs no label maps
    batch = make_batch(model.config)
    rows, columns = model.extension.heads["counts"].grid
    targets = torch.zeros(batch.images.shape[0], rows * columns, len(CHANNELS))
    targets[0, 0, CHANNELS.index("centre/car")] = 1.0
    patches = model.config.num_image_tokens  # the heads' own tokens come after the connector's
    model.train()
    trained = model.encode_images(batch.images, targets)[0][:, patches:]
    answered = model.eval().encode_images(batch.images)[0][:, patches:]
    perturb(model.extension.heads, std=1.0)
    torch.testing.assert_close(model.train().encode_images(batch.images, targets)[0][:, patches:], trained)
    assert not torch.allclose(model.eval().encode_images(batch.images)[0][:, patches:], answered)
    with pytest.raises(ValueError, match="model.perception.label_maps_in_training: .* no targets"):
        model.train().encode_images(batch.images)
    with pytest.raises(ParamError, match="model.perception.label_maps_in_training: .* needs model.perception.to_dec"):
        PerceptionConfig(heads={"grounding": 1.0}, label_maps_in_training=True).validate()
