"""SigLIP vision encoder (ViT without CLS token) with the parameter names of the pinned transformers'
``SiglipVisionModel`` (``vision_use_head=False``; docs/architecture.md, the model): its state_dict loads strictly."""

import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vlm.config import check
from vlm.models.attention import attention, init_weights
from vlm.models.pretrained import load_strict, read_config, sub_model_tensors, weights_files


@dataclass
class SiglipVisionConfig:
    hidden_size: int = 192
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 3
    num_channels: int = 3
    image_size: int = 128  # the image height, and its width unless image_width says otherwise
    patch_size: int = 16
    layer_norm_eps: float = 1e-6
    image_width: int | None = None  # None: image_size (square, as HF's SigLIP)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def height_width(self) -> tuple[int, int]:
        """The input images' ``(H, W)`` in pixels."""
        return self.image_size, self.image_width or self.image_size

    @property
    def grid(self) -> tuple[int, int]:
        """The patch grid ``(gh, gw)``: rows and columns of patches."""
        height, width = self.height_width
        return height // self.patch_size, width // self.patch_size

    @property
    def num_patches(self) -> int:
        rows, columns = self.grid
        return rows * columns

    def validate(self, prefix: str = "SiglipVisionConfig") -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_channels", "image_size", "patch_size", "layer_norm_eps"):
            check(getattr(self, name) > 0, f"{prefix}.{name}", f"must be positive, got {getattr(self, name)}")
        check(self.hidden_size % self.num_attention_heads == 0, f"{prefix}.hidden_size",
              f"must be divisible by {prefix}.num_attention_heads "
              f"({self.hidden_size} % {self.num_attention_heads} = {self.hidden_size % self.num_attention_heads})")
        check(self.image_width is None or self.image_width > 0, f"{prefix}.image_width",
              f"must be positive or null, got {self.image_width}")
        for name, size in zip(("image_size", "image_width"), self.height_width):
            check(size % self.patch_size == 0, f"{prefix}.{name}", f"must be divisible by {prefix}.patch_size "
                  f"({size} % {self.patch_size} = {size % self.patch_size})")


@dataclass
class SiglipVisionOutput:
    last_hidden_state: torch.Tensor  # [N, P, D]
    attentions: tuple[torch.Tensor, ...] | None = None  # per layer [N, H, P, P], explicit path only


def resize_position_embeddings(position_embeddings: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Bicubically resample square learned positions ``[g*g, D]`` to ``grid`` (h, w): ``[h*w, D]`` (as transformers)."""
    num_positions, dim = position_embeddings.shape
    side = math.isqrt(num_positions)
    if side * side != num_positions:
        raise ValueError(f"position embeddings do not form a square grid: {num_positions} positions")
    if (side, side) == tuple(grid):
        return position_embeddings
    table = position_embeddings.reshape(1, side, side, dim).permute(0, 3, 1, 2)  # [1, D, g, g]
    table = F.interpolate(table, size=grid, mode="bicubic", align_corners=False)  # [1, D, h, w]
    return table.permute(0, 2, 3, 1).reshape(grid[0] * grid[1], dim)


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size,
                                         kernel_size=config.patch_size, stride=config.patch_size)
        self.position_embedding = nn.Embedding(config.num_patches, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor, patch_residual: torch.Tensor | None = None) -> torch.Tensor:
        """-> embeddings ``[N, P, D]``; a vision adapter's ``patch_residual`` ``[N, D, h, w]`` adds to the patches."""
        _, _, height, width = pixel_values.shape
        patch_embeds = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))  # [N, D, h, w]
        if patch_residual is not None:
            patch_embeds = patch_embeds + patch_residual
        embeddings = patch_embeds.flatten(2).transpose(1, 2)  # [N, h*w, D]
        positions = self.position_embedding.weight  # [P, D]
        if embeddings.shape[1] != positions.shape[0]:
            raise ValueError(f"image of {height}x{width} px gives {embeddings.shape[1]} patches but the encoder "
                             f"has {positions.shape[0]} positions")
        return embeddings + positions


class SiglipAttention(nn.Module):
    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor, output_attentions: bool = False):
        batch, length, _ = hidden_states.shape
        shape = (batch, length, self.num_heads, self.head_dim)
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)  # [N, H, P, Dh]
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        attn_output, weights = attention(query, key, value, output_attentions=output_attentions)  # [N, H, P, Dh]
        attn_output = attn_output.transpose(1, 2).reshape(batch, length, -1)  # [N, P, D]
        return self.out_proj(attn_output), weights


class SiglipMLP(nn.Module):
    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(hidden_states), approximate="tanh"))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = SiglipAttention(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = SiglipMLP(config)

    def forward(self, hidden_states: torch.Tensor, output_attentions: bool = False):
        attn_output, weights = self.self_attn(self.layer_norm1(hidden_states), output_attentions)
        hidden_states = hidden_states + attn_output
        hidden_states = hidden_states + self.mlp(self.layer_norm2(hidden_states))
        return hidden_states, weights


class SiglipEncoder(nn.Module):
    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden_states: torch.Tensor, output_attentions: bool = False):
        attentions = []
        for layer in self.layers:
            hidden_states, weights = layer(hidden_states, output_attentions)
            attentions.append(weights)
        return hidden_states, tuple(attentions) if output_attentions else None


class SiglipVisionModel(nn.Module):
    """Patch embedding + learned positions -> pre-norm transformer layers -> post-layernorm; no CLS, no head."""

    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        config.validate()
        self.config = config
        self.embeddings = SiglipVisionEmbeddings(config)
        self.encoder = SiglipEncoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.apply(init_weights)

    def forward(self, pixel_values: torch.Tensor, output_attentions: bool = False,
                patch_residual: torch.Tensor | None = None) -> SiglipVisionOutput:
        """``pixel_values`` float ``[N, C, H, W]``, normalised; ``output_attentions``: the explicit softmax path, each
        layer's attention probabilities returned; ``patch_residual``: :meth:`SiglipVisionEmbeddings.forward`."""
        hidden_states = self.embeddings(pixel_values, patch_residual)  # [N, P, D]
        hidden_states, attentions = self.encoder(hidden_states, output_attentions)
        return SiglipVisionOutput(self.post_layernorm(hidden_states), attentions)


# Pretrained checkpoints on disk
# transformers' SiglipVisionConfig defaults: config.json files only list values that differ from them.
_HF_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                       "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 16,
                       "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh"}
_PATCH_KEY = "embeddings.patch_embedding.weight"


def siglip_config_from_pretrained(path: str | os.PathLike, num_attention_heads: int | None = None
                                  ) -> SiglipVisionConfig:
    """The vision config of a checkpoint: its ``config.json`` (SigLIP, SigLIP-vision or PaliGemma; in the folder or
    beside the weights file), else inferred from the tensor shapes (but the head count, which must then be given)."""
    config = _config_from_json(Path(path))
    return config or _config_from_shapes(_vision_state_dict(Path(path)), num_attention_heads, path)


def load_pretrained_siglip(path: str | os.PathLike, image_size: int | None = None,
                           num_attention_heads: int | None = None, image_width: int | None = None
                           ) -> SiglipVisionModel:
    """A :class:`SiglipVisionModel` from a HuggingFace checkpoint on disk, a folder or one weights file (sizes from a
    ``config.json``, else the tensor shapes and ``num_attention_heads``): the vision weights, whatever their prefix,
    load strictly; another ``image_size`` (``image_width`` None: square) resamples the positions once."""
    path = Path(path)
    state_dict = _vision_state_dict(path)
    config = _config_from_json(path) or _config_from_shapes(state_dict, num_attention_heads, path)
    size = (image_size, image_width or image_size)
    if image_size is not None and size != config.height_width:
        if any(side % config.patch_size for side in size):
            raise ValueError(f"{path}: image size {size[0]} x {size[1]} (H x W) is not divisible by the "
                             f"checkpoint's patch size {config.patch_size}")
        key = "embeddings.position_embedding.weight"
        grid = (size[0] // config.patch_size, size[1] // config.patch_size)
        state_dict[key] = resize_position_embeddings(state_dict[key].float(), grid).to(state_dict[key].dtype)
        config = replace(config, image_size=image_size, image_width=image_width)
    model = SiglipVisionModel(config)
    load_strict(model, state_dict, f"{path}: not the encoder its config describes")
    return model


def _config_from_json(path: Path) -> SiglipVisionConfig | None:
    found = read_config(path)
    if found is None:
        return None
    config_file, raw = found
    vision = raw["vision_config"] if "vision_config" in raw else raw
    values = {**_HF_VISION_DEFAULTS, **{k: vision[k] for k in _HF_VISION_DEFAULTS if k in vision}}
    if values.pop("hidden_act") != "gelu_pytorch_tanh":
        raise ValueError(f"{config_file}: hidden_act {vision['hidden_act']!r} is not SigLIP's gelu_pytorch_tanh")
    return SiglipVisionConfig(**values)


def _config_from_shapes(state_dict: dict[str, torch.Tensor], num_attention_heads: int | None,
                        path: str | os.PathLike) -> SiglipVisionConfig:
    if num_attention_heads is None:
        raise ValueError(f"{path}: no config.json beside the weights: put the checkpoint's config.json beside "
                         f"them (or, from Python, pass num_attention_heads, the one size the tensor shapes do "
                         f"not give)")
    hidden_size, num_channels, patch_size, _ = state_dict[_PATCH_KEY].shape
    num_positions = state_dict["embeddings.position_embedding.weight"].shape[0]
    layers = {int(m.group(1)) for k in state_dict if (m := re.match(r"encoder\.layers\.(\d+)\.", k))}
    return SiglipVisionConfig(
        hidden_size=hidden_size, intermediate_size=state_dict["encoder.layers.0.mlp.fc1.weight"].shape[0],
        num_hidden_layers=len(layers), num_attention_heads=num_attention_heads, num_channels=num_channels,
        image_size=math.isqrt(num_positions) * patch_size, patch_size=patch_size)


def _vision_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The vision-encoder tensors of a checkpoint, keys relative to :class:`SiglipVisionModel`."""
    return sub_model_tensors(weights_files(path, "SigLIP"), _PATCH_KEY, "SigLIP vision encoder", drop="head.")
