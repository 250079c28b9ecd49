"""TrafficVLM: configs from params, the Batch contract, prefix-LM attention, padding, answer/generate,
attention maps, autocast, and parity with HuggingFace PaliGemma."""

from __future__ import annotations

import json

import pytest
import torch

from vlm.models import SiglipVisionConfig, SiglipVisionModel, TrafficVLM, VLMConfig, build_vlm
from vlm.params import ParamError

VOCAB_SIZE, EOS, YES, NO = 40, 3, 4, 5  # as in conftest.tiny_config and the tokenizer contract
FORWARD_KEYS = ("images", "image_index", "input_ids", "attention_mask", "prefix_lengths")
CANDIDATES = [[YES, EOS], [NO, EOS], [12, EOS], [13, 14, EOS], [15]]


def build(config, seed=0, **overrides) -> TrafficVLM:
    torch.manual_seed(seed)
    return TrafficVLM(config(**overrides)).eval()


def inputs(batch: dict) -> dict:
    return {k: batch[k] for k in FORWARD_KEYS}


# ---------------------------------------------------------------- configuration


def test_from_params_builds_the_default_model_config():
    import numpy as np

    config = VLMConfig.from_params({}, vocab_size=np.int64(57), image_size=128,
                                   image_mean=np.array([0.3, 0.4, 0.5], dtype=np.float32),
                                   image_std=[0.2, 0.2, 0.2])
    assert config.gemma.vocab_size == 57 and config.siglip.image_size == 128
    assert config.num_image_tokens == 64 and config.image_mean == pytest.approx([0.3, 0.4, 0.5])
    assert VLMConfig.from_dict(config.to_dict()) == config
    qformer = VLMConfig.from_params({"connector": "qformer", "qformer": {"num_query_tokens": 8}}, 57, 128)
    assert qformer.num_image_tokens == 8
    assert VLMConfig.from_params({"vision": "none"}, 57, 128).num_image_tokens == 0


@pytest.mark.parametrize("section, message", [
    ({"siglip": {"hidden_size": 190}},
     "model.siglip.hidden_size: must be divisible by model.siglip.num_attention_heads (190 % 3 = 1)"),
    ({"gemma": {"num_key_value_heads": 2}},
     "model.gemma.num_attention_heads: must be divisible by model.gemma.num_key_value_heads (3 % 2 = 1)"),
    ({"qformer": {"num_attention_heads": 5}}, "model.qformer.hidden_size: must be divisible by"),
    ({"siglip": {"patch_size": 24}}, "model.siglip.patch_size: must divide the image size of the data (128 % 24 = 8)"),
    ({"gemma": {"vocab_size": 10}}, "model.gemma.vocab_size: set from the vocabulary size"),
    ({"siglip": {"image_size": 64}}, "model.siglip.image_size: set from the packed image size"),
    ({"gemma": {"layers": 2}}, "model.gemma.layers: unknown key"),
    ({"gemma": {"num_hidden_layers": "4"}}, "model.gemma.num_hidden_layers: must be an integer"),
    ({"connector": "mlp"}, "model.connector: must be one of 'linear', 'qformer'"),
    ({"qformer": 3}, "model.qformer: must be a mapping"),
    ({"vision_checkpoint": "/no/such/siglip"}, "model.vision_checkpoint: SigLIP checkpoint not found"),
])
def test_from_params_rejects_bad_values_naming_the_key(section, message):
    with pytest.raises(ParamError) as e:
        VLMConfig.from_params(section, vocab_size=57, image_size=128)
    assert message in str(e.value)


def test_pretrained_siglip_checkpoint_starts_the_vision_tower(tmp_path, config):
    from safetensors.torch import save_file

    torch.manual_seed(1)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=64,
                  patch_size=8)
    source = SiglipVisionModel(SiglipVisionConfig(**vision))
    save_file({f"vision_model.{k}": v for k, v in source.state_dict().items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "siglip", "vision_config": vision}))
    section = {"vision_checkpoint": str(tmp_path), "gemma": {"hidden_size": 32, "num_attention_heads": 2},
               "siglip": {"hidden_size": 64}}  # not used: the checkpoint fixes the encoder
    with pytest.raises(ParamError, match=r"model.vision_checkpoint: its patch size: must divide the image size "
                                         r"of the data \(36 % 8 = 4\)"):
        VLMConfig.from_params(section, VOCAB_SIZE, 36)
    cfg = VLMConfig.from_params(section, VOCAB_SIZE, image_size=32, image_mean=[0.1] * 3, image_std=[0.2] * 3)
    assert cfg.siglip == SiglipVisionConfig(**{**vision, "image_size": 32})
    assert cfg.image_mean == [0.5] * 3  # the checkpoint's own normalisation, not the data's
    model = build_vlm(cfg)
    assert model.vision_tower.embeddings.position_embedding.weight.shape == (16, 32)  # 8x8 grid resampled to 4x4
    for key, value in source.state_dict().items():
        if "position_embedding" not in key:
            assert torch.equal(model.vision_tower.state_dict()[key], value), key


# ---------------------------------------------------------------- forward and the Batch contract


@pytest.mark.parametrize("connector, image_tokens", [("linear", 16), ("qformer", 4)])
def test_forward_returns_text_logits_and_answer_loss(config, make_batch, connector, image_tokens):
    model = build(config, connector=connector)
    batch = make_batch(model.config)
    out = model(**batch)
    assert model.num_image_tokens == image_tokens
    assert out.logits.shape == (*batch["input_ids"].shape, VOCAB_SIZE)
    # mean cross-entropy over the answer tokens only, logits at t predicting token t + 1
    log_probs = out.logits.log_softmax(-1)
    targets = batch["labels"][:, 1:]
    picked = log_probs[:, :-1].gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    expected = -picked[targets != -100].mean()
    torch.testing.assert_close(out.loss, expected)
    assert model(**inputs(batch)).loss is None


@pytest.mark.parametrize("connector", ["linear", "qformer"])
def test_gradient_reaches_every_parameter(config, make_batch, connector):
    model = build(config, connector=connector).train()
    model(**make_batch(model.config)).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_each_distinct_image_is_encoded_once(config, make_batch):
    model = build(config)
    batch = make_batch(model.config, batch=6, num_images=2)
    seen = []
    model.vision_tower.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    shared = model(**batch).logits
    assert seen == [2]
    duplicated = {**batch, "images": batch["images"][batch["image_index"]], "image_index": torch.arange(6)}
    torch.testing.assert_close(model(**duplicated).logits, shared, atol=1e-5, rtol=0)


def test_answer_tokens_never_see_later_tokens(config, make_batch):
    model = build(config)
    batch = make_batch(model.config)
    base = model(**batch).logits
    b = 3  # a row with a two-token answer
    start, end = int(batch["prefix_lengths"][b]), int(batch["attention_mask"][b].sum())
    for changed in range(start, end):
        ids = batch["input_ids"].clone()
        ids[b, changed] = 1 if ids[b, changed] != 1 else 2
        logits = model(**{**batch, "input_ids": ids}).logits
        torch.testing.assert_close(logits[b, :changed], base[b, :changed], atol=1e-6, rtol=0)
        assert not torch.allclose(logits[b, changed], base[b, changed], atol=1e-4)
        torch.testing.assert_close(logits[:b], base[:b], atol=1e-6, rtol=0)  # other rows untouched


def test_the_prefix_sees_the_whole_prefix(config, make_batch):
    model = build(config)
    batch = make_batch(model.config)
    base = model(**batch).logits
    b = 3
    ids = batch["input_ids"].clone()
    ids[b, int(batch["prefix_lengths"][b]) - 2] += 1  # the last question word
    logits = model(**{**batch, "input_ids": ids}).logits
    assert not torch.allclose(logits[b, 0], base[b, 0], atol=1e-4)  # [SOS] sees it: full attention in the prefix
    # the image tokens see the question too, so an image change reaches the first text position
    images = batch["images"].clone()
    images[batch["image_index"][b]] = 255 - images[batch["image_index"][b]]
    assert not torch.allclose(model(**{**batch, "images": images}).logits[b, 0], base[b, 0], atol=1e-4)


@pytest.mark.parametrize("connector", ["linear", "qformer"])
def test_padded_batch_matches_each_question_alone(config, make_batch, row, connector):
    model = build(config, connector=connector)
    batch = make_batch(model.config)
    logits = model(**batch).logits
    probs = model.answer(**inputs(batch), candidates=CANDIDATES)
    generated = model.generate(**inputs(batch), eos_token_id=-1, max_new_tokens=4)
    attention = model.image_attention(**inputs(batch))
    for b in range(batch["input_ids"].shape[0]):
        single = row(batch, b)
        n = single["input_ids"].shape[1]
        torch.testing.assert_close(model(**single).logits[0], logits[b, :n], atol=1e-5, rtol=0)
        torch.testing.assert_close(model.answer(**inputs(single), candidates=CANDIDATES)[0], probs[b],
                                   atol=1e-5, rtol=0)
        assert torch.equal(model.generate(**inputs(single), eos_token_id=-1, max_new_tokens=4)[0], generated[b])
        torch.testing.assert_close(model.image_attention(**inputs(single))[0], attention[b], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- answering


def test_answer_equals_scoring_each_candidate_with_a_full_forward(config, make_batch):
    model = build(config)
    batch = make_batch(model.config)
    probs = model.answer(**inputs(batch), candidates=CANDIDATES)
    assert probs.shape == (5, len(CANDIDATES))
    for b in range(5):
        prefix = batch["input_ids"][b, : int(batch["prefix_lengths"][b])].tolist()
        scores = []
        for candidate in CANDIDATES:
            ids = torch.tensor([prefix + candidate])
            logits = model(batch["images"], batch["image_index"][b:b + 1], ids, torch.ones_like(ids),
                           batch["prefix_lengths"][b:b + 1]).logits[0]
            log_probs = logits[len(prefix) - 1:-1].log_softmax(-1)
            scores.append(log_probs.gather(-1, torch.tensor(candidate)[:, None]).sum())
        torch.testing.assert_close(probs[b], torch.stack(scores).softmax(-1), atol=1e-5, rtol=0)


def test_generate_with_cache_equals_without(config, make_batch):
    model = build(config)
    batch = make_batch(model.config)
    cached = model.generate(**inputs(batch), eos_token_id=-1, max_new_tokens=5)
    uncached = model.generate(**inputs(batch), eos_token_id=-1, max_new_tokens=5, use_cache=False)
    assert cached.shape == (5, 5) and torch.equal(cached, uncached)
    # the first generated token is the argmax of the forward logits at [SEP]
    sep_logits = model(**batch).logits[torch.arange(5), batch["prefix_lengths"] - 1]
    assert torch.equal(cached[:, 0], sep_logits.argmax(-1))


def test_image_attention_maps(config, make_batch):
    model = build(config)
    batch = make_batch(model.config)
    maps = model.image_attention(**inputs(batch))
    assert maps.shape == (5, 2, 4, 16)  # [B, layers, heads, image tokens]
    assert (maps >= 0).all() and (maps.sum(-1) <= 1 + 1e-5).all() and (maps.sum(-1) > 0).all()
    with pytest.raises(ValueError, match="blind"):
        build(config, vision="none").image_attention(**inputs(batch))


def test_blind_variant_has_no_image_tokens(config, make_batch):
    model = build(config, vision="none")
    batch = make_batch(model.config)
    assert not any(k.startswith(("vision_tower", "multi_modal_projector")) for k in model.state_dict())
    out = model(None, None, batch["input_ids"], batch["attention_mask"], batch["prefix_lengths"], batch["labels"])
    assert out.logits.shape == (*batch["input_ids"].shape, VOCAB_SIZE) and torch.isfinite(out.loss)
    with_images = model(**batch)
    torch.testing.assert_close(with_images.logits, out.logits)
    assert model.answer(**inputs(batch), candidates=CANDIDATES).shape == (5, len(CANDIDATES))


# ---------------------------------------------------------------- mixed precision


def test_bf16_autocast_on_cpu(config, make_batch):
    model = build(config, connector="qformer").train()
    batch = make_batch(model.config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        probs = model.answer(**inputs(batch), candidates=CANDIDATES)
        generated = model.generate(**inputs(batch), eos_token_id=EOS, max_new_tokens=3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5))
    assert generated.shape[0] == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_autocast_on_cuda(config, make_batch):
    model = build(config).cuda().train()
    batch = {k: v.cuda() for k, v in make_batch(model.config).items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(**batch)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    model.eval()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        cached = model.generate(**inputs(batch), eos_token_id=-1, max_new_tokens=4)
        probs = model.answer(**inputs(batch), candidates=CANDIDATES)
    assert cached.shape == (5, 4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5, device="cuda"))


# ---------------------------------------------------------------- HuggingFace PaliGemma


def hf_paligemma(transformers, cfg: VLMConfig):
    vision = cfg.siglip
    text = cfg.gemma
    hf_config = transformers.PaliGemmaConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=vision.hidden_size,
                           intermediate_size=vision.intermediate_size, num_hidden_layers=vision.num_hidden_layers,
                           num_attention_heads=vision.num_attention_heads, image_size=vision.image_size,
                           patch_size=vision.patch_size, vision_use_head=False),
        text_config=dict(model_type="gemma", vocab_size=text.vocab_size, hidden_size=text.hidden_size,
                         intermediate_size=text.intermediate_size, num_hidden_layers=text.num_hidden_layers,
                         num_attention_heads=text.num_attention_heads, num_key_value_heads=text.num_key_value_heads,
                         head_dim=text.head_dim),
        image_token_index=text.vocab_size, projection_dim=text.hidden_size)
    torch.manual_seed(0)
    model = transformers.PaliGemmaForConditionalGeneration(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_matches_hf_paligemma(transformers, config, make_batch, tmp_path):
    """Same weights, same logits: the saved HF PaliGemma file loads into our layout (all but the tied LM
    head, which HF stores once as the embeddings), and the prefix-LM outputs agree."""
    from safetensors.torch import load_file

    ours = build(config)
    hf = hf_paligemma(transformers, ours.config)
    hf.save_pretrained(tmp_path)
    missing, unexpected = ours.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)
    assert missing == ["language_model.lm_head.weight"] and unexpected == []
    assert torch.equal(ours.language_model.lm_head.weight, hf.lm_head.weight)

    batch = make_batch(ours.config)
    tokens, (batch_size, length) = ours.num_image_tokens, batch["input_ids"].shape
    mean = torch.tensor(ours.config.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(ours.config.image_std).view(1, 3, 1, 1)
    pixel_values = (batch["images"][batch["image_index"]].float() / 255 - mean) / std
    image_ids = torch.full((batch_size, tokens), ours.config.gemma.vocab_size)
    positions = torch.arange(length)
    answer_part = (positions >= batch["prefix_lengths"][:, None]).long()  # token_type_ids: 0 prefix, 1 suffix
    with torch.no_grad():
        expected = hf(input_ids=torch.cat([image_ids, batch["input_ids"]], 1), pixel_values=pixel_values,
                      attention_mask=torch.cat([torch.ones(batch_size, tokens, dtype=torch.long),
                                                batch["attention_mask"]], 1),
                      token_type_ids=torch.cat([torch.zeros(batch_size, tokens, dtype=torch.long), answer_part], 1),
                      position_ids=torch.arange(tokens + length).expand(batch_size, -1)).logits[:, tokens:]
        got = ours(**batch).logits
    valid = batch["attention_mask"].bool()
    assert expected[valid].std() > 0.1  # logits that differ across tokens, not a degenerate comparison
    torch.testing.assert_close(got[valid], expected[valid], atol=1e-4, rtol=0)


def test_pixel_shuffle_merges_neighbouring_patches():
    from vlm.models.connector import pixel_shuffle

    grid = torch.arange(16, dtype=torch.float32).view(1, 16, 1)  # patch t has feature t, 4 x 4 grid
    merged = pixel_shuffle(grid, 2)  # [1, 4, 4]
    assert merged.shape == (1, 4, 4)
    assert merged[0, 0].tolist() == [0, 1, 4, 5]  # the top-left 2 x 2 block
    assert merged[0, 3].tolist() == [10, 11, 14, 15]  # the bottom-right block
    config = VLMConfig.from_params({"pixel_shuffle": 2, "siglip": {"patch_size": 16}}, 57, 128)
    assert config.num_image_tokens == 16
    model = TrafficVLM(config)
    tokens, grounding_logits, heat = model.encode_images(torch.randint(0, 255, (3, 3, 128, 128), dtype=torch.uint8))
    assert grounding_logits is None and tokens.shape == (3, 16, config.gemma.hidden_size)
    with pytest.raises(ParamError, match="model.pixel_shuffle: must be >= 1 and divide the patch grid"):
        VLMConfig.from_params({"pixel_shuffle": 3, "siglip": {"patch_size": 16}}, 57, 128)


# ---------------------------------------------------------------- grounding (auxiliary per-patch loss)


def test_grounding_loss_is_added_with_its_weight_and_trains_the_encoder(config, make_batch):
    from vlm.data.grounding import FRAME_CHANNELS, GROUNDING_CHANNELS, GROUNDING_COUNT_CHANNELS, PATCH_CHANNELS
    from vlm.models.grounding import FRAME_LOSS_WEIGHT

    model = build(config, grounding_weight=2.0).train()
    batch = make_batch(model.config)
    num_images, patches = batch["images"].shape[0], model.config.siglip.num_patches
    generator = torch.Generator().manual_seed(1)
    targets = (torch.rand(num_images, patches, len(GROUNDING_CHANNELS), generator=generator) > 0.8).float()
    is_count = torch.tensor([name in GROUNDING_COUNT_CHANNELS for name in GROUNDING_CHANNELS])
    targets[..., is_count] *= 2  # count channels may exceed 1
    frame_targets = torch.randint(-1, 2, (num_images, len(FRAME_CHANNELS)), generator=generator).float()
    frame_targets[0] = 1.0  # at least one defined attribute
    targets[..., -len(FRAME_CHANNELS):] = frame_targets[:, None]  # once per image, -1 = undefined
    plain = model(**batch)
    grounded = model(**batch, grounding=targets)
    logits = model.encode_images(batch["images"])[1]  # [N, P, C_head]
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
    torch.testing.assert_close(grounded.grounding_loss, expected)
    torch.testing.assert_close(grounded.loss, plain.loss + 2.0 * expected)
    assert plain.grounding_loss is None
    grounded.loss.backward()
    assert model.grounding_head.linear.weight.grad.abs().sum() > 0
    assert model.grounding_head.frame.weight.grad.abs().sum() > 0
    assert model.vision_tower.embeddings.patch_embedding.weight.grad.abs().sum() > 0


def test_no_grounding_head_without_weight_or_image(config):
    assert build(config).grounding_head is None
    assert build(config, vision="none", grounding_weight=1.0).grounding_head is None
    with pytest.raises(ParamError, match="model.grounding_weight: must be >= 0"):
        VLMConfig.from_params({"grounding_weight": -1}, 57, 128)
    with pytest.raises(ParamError, match="model.grounding_tokens: needs a trained grounding head"):
        VLMConfig.from_params({"grounding_tokens": True}, 57, 128)
    blind = build(config, vision="none", grounding_tokens=True)  # no image: nothing to ground
    assert blind.grounding_totals_projector is None and blind.num_image_tokens == 0


def test_grounding_tokens_give_the_decoder_the_maps_and_their_totals(config, make_batch):
    from vlm.data.grounding import FRAME_CHANNELS
    from vlm.models.grounding import HEAD_CHANNELS, NUM_THRESHOLDS

    model = build(config, grounding_weight=1.0, grounding_tokens=True).eval()
    assert model.num_image_tokens == model.config.siglip.num_patches + 1  # patch tokens, then the totals token
    batch = make_batch(model.config)
    tokens, logits, heat = model.encode_images(batch["images"])
    assert heat is None  # no object-centre head
    assert tokens.shape == (batch["images"].shape[0], model.num_image_tokens, model.config.gemma.hidden_size)
    head = model.grounding_head
    maps = head.maps(logits)
    is_count = head.is_count
    torch.testing.assert_close(maps[..., ~is_count], logits[..., ~is_count].sigmoid())
    torch.testing.assert_close(maps[..., is_count], logits[..., is_count].exp())
    # totals thermometer-coded: an image total of 2.0 turns the codes for > 0.5 and > 1.5 on, the rest off
    codes = head.totals(torch.full((1, 4, len(HEAD_CHANNELS)), 0.5)).view(-1, NUM_THRESHOLDS)
    assert codes.shape == (len(HEAD_CHANNELS) - len(FRAME_CHANNELS), NUM_THRESHOLDS)  # no frame totals
    assert (codes[:, :2] > 0.8).all() and (codes[:, 2:] < 0.2).all()
    output = model.train()(**batch)
    output.loss.backward()  # the answers reach the grounding head through the maps
    assert head.linear.weight.grad.abs().sum() > 0


def test_object_centres_add_heatmaps_their_focal_loss_and_peak_counts(config, make_batch):
    from vlm.data.grounding import GROUNDING_CHANNELS, HEAT_CHANNELS, PATCH_CHANNELS
    from vlm.models.centres import CENTRE_LOSS_WEIGHT, NUM_COUNT_THRESHOLDS, NUM_REGIONS, STRIDE
    from vlm.models.siglip import SiglipVisionConfig

    siglip = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=8, stem_channels=[8, 8, 16])
    with pytest.raises(ParamError, match="model.object_centres: needs model.grounding_tokens"):
        config(siglip=siglip, grounding_weight=1.0, object_centres=True).validate()
    with pytest.raises(ParamError, match="model.object_centres: needs a conv stem of at least 3 stages"):
        config(grounding_weight=1.0, grounding_tokens=True, object_centres=True).validate()
    model = build(config, siglip=siglip, grounding_weight=1.0, grounding_tokens=True, object_centres=True).train()
    batch = make_batch(model.config)
    cells = (32 // STRIDE) ** 2
    targets = torch.zeros(batch["images"].shape[0], cells, len(GROUNDING_CHANNELS))
    targets[0, 5, len(PATCH_CHANNELS) + 2] = 1.0  # one car centre in image 0
    tokens, logits, heat = model.encode_images(batch["images"])
    assert heat.shape == (batch["images"].shape[0], cells, len(HEAT_CHANNELS))
    output = model(**batch, grounding=targets)
    expected = model.grounding_head.loss(logits, targets) + CENTRE_LOSS_WEIGHT * model.centre_head.loss(heat, targets)
    torch.testing.assert_close(output.grounding_loss, expected)
    output.loss.backward()
    assert model.centre_head.out.weight.grad.abs().sum() > 0

    # two peaks above 0.5 in the left third of an 8 x 8 heatmap, one in the right third; a lower neighbour
    # of a peak is not a peak
    prob = torch.full((1, 8, 8, len(HEAT_CHANNELS)), 0.01)
    prob[0, 1, 0, 2], prob[0, 5, 1, 2], prob[0, 5, 2, 2], prob[0, 3, 7, 2] = 0.9, 0.8, 0.7, 0.6
    # footpoints count in the near part (rows below 0.6) of the left / straight / right paths
    vulnerable = HEAT_CHANNELS.index("foot/vulnerable")
    prob[0, 6, 3, vulnerable], prob[0, 2, 3, vulnerable] = 0.9, 0.9  # near, in left and straight; far
    counts = model.centre_head.peak_counts(torch.logit(prob.view(1, 64, -1)))
    assert counts.shape == (1, len(HEAT_CHANNELS), NUM_REGIONS)
    assert counts[0, 2].tolist() == [3, 2, 1] and counts[0, :, 0].sum() == 3 + 1  # image, left third, right third
    assert counts[0, vulnerable].tolist() == [1, 1, 0]  # column 3.5 / 8 = 0.44: left and straight paths
    codes = model.centre_head.count_features(torch.logit(prob.view(1, 64, -1)))
    codes = codes.view(len(HEAT_CHANNELS), NUM_REGIONS, -1)
    assert codes.shape[-1] == NUM_COUNT_THRESHOLDS and codes[2, 0].tolist()[:4] == [1, 1, 1, 0]
