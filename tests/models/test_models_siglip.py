"""SigLIP vision encoder: shapes, attention paths, positions, HF parity, pretrained loading."""

from __future__ import annotations

import json

import pytest
import torch

from vlm.config import ParamError
from vlm.models.siglip import SiglipVisionConfig, SiglipVisionModel, load_pretrained_siglip

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


def encoder(**overrides) -> SiglipVisionModel:
    torch.manual_seed(0)
    return SiglipVisionModel(SiglipVisionConfig(**{**SMALL, "image_size": 32, "patch_size": 8, **overrides})).eval()


def pixels(n: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("patch_size", [8, 16, 32])
def test_one_token_per_patch(patch_size):
    model = encoder(image_size=64, patch_size=patch_size)
    out = model(pixels(2, 64))
    assert out.last_hidden_state.shape == (2, (64 // patch_size) ** 2, 32)


@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_explicit_attention_path_returns_probabilities_and_matches_fused(num_heads):
    model = encoder(num_attention_heads=num_heads)
    x = pixels(3, 32)
    explicit = model(x, output_attentions=True)
    assert len(explicit.attentions) == 2
    for weights in explicit.attentions:
        assert weights.shape == (3, num_heads, 16, 16)
        assert (weights >= 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, num_heads, 16), atol=1e-5, rtol=0)
    fused = model(x)
    assert fused.attentions is None
    torch.testing.assert_close(explicit.last_hidden_state, fused.last_hidden_state, atol=1e-5, rtol=0)


def test_batch_items_are_independent():
    model = encoder()
    x = pixels(4, 32)
    together = model(x).last_hidden_state
    for i in range(4):
        torch.testing.assert_close(model(x[i:i + 1]).last_hidden_state[0], together[i], atol=1e-5, rtol=0)


def test_gradient_reaches_every_parameter():
    model = encoder().train()
    model(pixels(2, 32)).last_hidden_state.pow(2).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_truncated_normal_init():
    model = SiglipVisionModel(SiglipVisionConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                                 num_attention_heads=4))
    weight = model.encoder.layers[0].mlp.fc1.weight
    assert weight.abs().max() <= 0.04 + 1e-6
    assert 0.014 < weight.std() < 0.02
    assert model.encoder.layers[0].mlp.fc1.bias.abs().sum() == 0
    assert (model.post_layernorm.weight == 1).all()


def test_other_resolution_is_a_clear_error():
    """Another resolution's positions come from load_pretrained_siglip(image_size=...) (tested against transformers'
    interpolate_pos_encoding below)."""
    with pytest.raises(ValueError, match="image of 48x48 px gives 36 patches but the encoder has 16 positions"):
        encoder()(pixels(1, 48))


@pytest.mark.parametrize("overrides, message", [
    ({"hidden_size": 30, "num_attention_heads": 4},
     "vision.hidden_size: must be divisible by vision.num_attention_heads"),
    ({"image_size": 30}, "vision.image_size: must be divisible by vision.patch_size (30 % 8 = 6)"),
    ({"num_hidden_layers": 0}, "vision.num_hidden_layers: must be positive"),
])
def test_invalid_config_names_the_key(overrides, message):
    config = SiglipVisionConfig(**{**SMALL, "image_size": 32, "patch_size": 8, **overrides})
    with pytest.raises(ParamError) as e:
        config.validate("vision")
    assert message in str(e.value)


# ---------------------------------------------------------------- HuggingFace parity and checkpoints


def hf_vision_model(transformers, num_heads=2, image_size=32, seed=0):
    torch.manual_seed(seed)
    config = transformers.SiglipVisionConfig(**{**SMALL, "num_attention_heads": num_heads}, image_size=image_size,
                                             patch_size=8, vision_use_head=False, attn_implementation="eager")
    model = transformers.SiglipVisionModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_matches_hf_siglip_vision_model(transformers, num_heads):
    hf = hf_vision_model(transformers, num_heads)
    ours = encoder(num_attention_heads=num_heads)
    ours.load_state_dict(hf.state_dict(), strict=True)
    x = pixels(3, 32)
    with torch.no_grad():
        expected = hf(pixel_values=x).last_hidden_state
        torch.testing.assert_close(ours(x).last_hidden_state, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours(x, output_attentions=True).last_hidden_state, expected, atol=1e-5, rtol=0)


def test_loads_a_saved_hf_siglip_checkpoint_folder(transformers, tmp_path):
    """A full SiglipModel folder (text tower, pooling head, keys under ``vision_model.``), like a download of
    google/siglip-base-patch16-224: the vision part loads strictly and matches HF's vision outputs."""
    torch.manual_seed(0)
    text = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    vision = dict(**SMALL, image_size=32, patch_size=8)
    hf = transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=vision)).eval()
    hf.save_pretrained(tmp_path)
    ours = load_pretrained_siglip(tmp_path).eval()
    assert ours.config == SiglipVisionConfig(**vision)
    x = pixels(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).last_hidden_state, hf.vision_model(pixel_values=x).last_hidden_state,
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("safe_serialization", [True, False])
def test_loads_a_sharded_checkpoint_folder(transformers, tmp_path, safe_serialization):
    """Shards and their index (model.safetensors.index.json), as PaliGemma-3B's download has them (transformers 4's
    pytorch_model.bin.index.json too): the vision tensors are found in whichever shards hold them; a missing shard
    is named."""
    hf = hf_vision_model(transformers)
    if safe_serialization:
        hf.save_pretrained(tmp_path, max_shard_size="20KB")
        index = tmp_path / "model.safetensors.index.json"
    else:  # transformers 5 writes safetensors only: the .bin layout by hand
        hf.config.save_pretrained(tmp_path)
        items, weight_map = list(hf.state_dict().items()), {}
        for k in range(3):
            name = f"pytorch_model-{k + 1:05d}-of-00003.bin"
            torch.save({f"vision_model.{key}": value for key, value in items[k::3]}, tmp_path / name)
            weight_map |= {f"vision_model.{key}": name for key, _ in items[k::3]}
        index = tmp_path / "pytorch_model.bin.index.json"
        index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    assert len(shards) > 2
    loaded = load_pretrained_siglip(tmp_path)
    for key, value in hf.state_dict().items():
        assert torch.equal(loaded.state_dict()[key.removeprefix("vision_model.")], value), key
    (tmp_path / shards[1]).unlink()
    with pytest.raises(FileNotFoundError, match=rf"{index.name}: names {shards[1]}, which is not in .* \(1 of "
                                                rf"{len(shards)} shards missing\)"):
        load_pretrained_siglip(tmp_path)


def test_loads_a_bin_file_with_legacy_prefix_and_resizes_positions(transformers, tmp_path):
    hf = hf_vision_model(transformers)
    weights = tmp_path / "pytorch_model.bin"
    torch.save({f"vision_model.{k}": v for k, v in hf.state_dict().items()}, weights)
    with pytest.raises(ValueError, match="num_attention_heads"):
        load_pretrained_siglip(weights)
    ours = load_pretrained_siglip(weights, num_attention_heads=2).eval()
    assert ours.config == SiglipVisionConfig(**SMALL, image_size=32, patch_size=8)
    resized = load_pretrained_siglip(weights, num_attention_heads=2, image_size=48).eval()
    assert resized.config.image_size == 48
    x = pixels(2, 48)
    with torch.no_grad():
        torch.testing.assert_close(resized(x).last_hidden_state,
                                   hf(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state,
                                   atol=1e-5, rtol=0)


def test_loads_a_safetensors_file_with_config_beside_it(tmp_path):
    from safetensors.torch import save_file

    source = encoder()
    save_file({f"vision_tower.{k}": v.contiguous() for k, v in source.state_dict().items()},
              tmp_path / "weights.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "paligemma", "vision_config": {
        **SMALL, "image_size": 32, "patch_size": 8, "model_type": "siglip_vision_model"}}))
    loaded = load_pretrained_siglip(tmp_path / "weights.safetensors")
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_pretrained_siglip(tmp_path / "nope.safetensors")
    with pytest.raises(FileNotFoundError, match="model.safetensors or pytorch_model.bin in this folder, nor a sharded"):
        load_pretrained_siglip(tmp_path)


def test_a_rectangular_image_has_a_rectangular_patch_grid():
    model = encoder(image_size=32, image_width=56)  # 4 x 7 patches of 8 px
    assert (model.config.grid, model.config.num_patches) == ((4, 7), 28)
    out = model(torch.randn(2, 3, 32, 56, generator=torch.Generator().manual_seed(0)))
    assert out.last_hidden_state.shape == (2, 28, 32)
    with pytest.raises(ValueError, match="gives 16 patches but the encoder has 28 positions"):
        model(pixels(1, 32))
    with pytest.raises(ParamError, match="image_width: must be divisible by"):
        SiglipVisionConfig(image_size=32, image_width=60, patch_size=8).validate()


def test_pretrained_square_positions_resample_to_a_rectangular_grid(tmp_path):
    from safetensors.torch import save_file

    source = encoder()  # 32 px: 4 x 4 positions
    save_file({f"vision_model.{k}": v.contiguous() for k, v in source.state_dict().items()},
              tmp_path / "model.safetensors")
    loaded = load_pretrained_siglip(tmp_path / "model.safetensors", image_size=32, image_width=64,
                                    num_attention_heads=2)
    assert loaded.config.grid == (4, 8)
    assert loaded.embeddings.position_embedding.weight.shape == (32, 32)  # 4 x 8 positions
    assert loaded(torch.randn(1, 3, 32, 64)).last_hidden_state.shape == (1, 32, 32)
