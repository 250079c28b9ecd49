"""SigLIP vision encoder (ViT without CLS token), parameter-compatible with HuggingFace.

Parameter names are those of ``transformers.SiglipVisionModel`` (``vision_use_head=False``) as of the
pinned transformers 5.x: ``embeddings.patch_embedding``, ``embeddings.position_embedding``,
``encoder.layers.N.{layer_norm1, self_attn.{q,k,v,out}_proj, layer_norm2, mlp.fc1, mlp.fc2}``,
``post_layernorm``. A HuggingFace state_dict therefore loads with ``strict=True``; checkpoint files
written by older transformers (keys under ``vision_model.``) go through
:func:`load_pretrained_siglip`, which strips that prefix exactly as transformers does.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vlm.models.attention import attention
from vlm.models.pretrained import load_tensors, read_config, weights_file
from vlm.params import check


@dataclass
class SiglipVisionConfig:
    hidden_size: int = 192
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 3
    num_channels: int = 3
    image_size: int = 128
    patch_size: int = 16
    layer_norm_eps: float = 1e-6
    # Channels of an optional convolutional stem (one stride-2 stage per entry; 2**len = patch_size) whose
    # output is added to the patch embedding; empty = SigLIP as published (and as pretrained checkpoints).
    stem_channels: list[int] = field(default_factory=list)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def validate(self, prefix: str = "SiglipVisionConfig") -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_channels", "image_size", "patch_size"):
            check(getattr(self, name) > 0, f"{prefix}.{name}", f"must be positive, got {getattr(self, name)}")
        check(all(isinstance(c, int) and c > 0 for c in self.stem_channels), f"{prefix}.stem_channels",
              f"must be positive channel counts, got {self.stem_channels}")
        check(not self.stem_channels or 2 ** len(self.stem_channels) == self.patch_size, f"{prefix}.stem_channels",
              f"{len(self.stem_channels)} stride-2 stages reduce by {2 ** len(self.stem_channels)}, not by "
              f"{prefix}.patch_size ({self.patch_size}); give log2(patch_size) channel counts or none")
        check(self.layer_norm_eps > 0, f"{prefix}.layer_norm_eps", f"must be positive, got {self.layer_norm_eps}")
        check(self.hidden_size % self.num_attention_heads == 0, f"{prefix}.hidden_size",
              f"must be divisible by {prefix}.num_attention_heads "
              f"({self.hidden_size} % {self.num_attention_heads} = {self.hidden_size % self.num_attention_heads})")
        check(self.image_size % self.patch_size == 0, f"{prefix}.image_size",
              f"must be divisible by {prefix}.patch_size "
              f"({self.image_size} % {self.patch_size} = {self.image_size % self.patch_size})")


@dataclass
class SiglipVisionOutput:
    last_hidden_state: torch.Tensor  # [N, P, D]
    attentions: tuple[torch.Tensor, ...] | None = None  # per layer [N, H, P, P], explicit path only
    stem_features: list[torch.Tensor] | None = None  # each conv stem stage's output, with a stem


def resize_position_embeddings(position_embeddings: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Bicubically resample a square grid of learned positions ``[G*G, D]`` to ``grid`` -> ``[h*w, D]``."""
    num_positions, dim = position_embeddings.shape
    side = math.isqrt(num_positions)
    if side * side != num_positions:
        raise ValueError(f"position embeddings do not form a square grid: {num_positions} positions")
    if (side, side) == tuple(grid):
        return position_embeddings
    table = position_embeddings.reshape(1, side, side, dim).permute(0, 3, 1, 2)  # [1, D, G, G]
    table = F.interpolate(table, size=grid, mode="bicubic", align_corners=False)  # [1, D, h, w]
    return table.permute(0, 2, 3, 1).reshape(grid[0] * grid[1], dim)


class ConvStem(nn.Module):
    """Early convolutions (Xiao et al. 2021, "Early Convolutions Help Transformers See Better"): per stage a
    stride-2 and a stride-1 3x3 convolution, each with GroupNorm and ReLU, then a 1x1 projection to the
    encoder width. ``[N, C, S, S]`` -> ``[N, D, S / 2**stages, S / 2**stages]``, and each stage's output
    (``[N, channels[i], S / 2**(i+1), S / 2**(i+1)]``: an object-centre head reads them). GroupNorm, not BatchNorm:
    a sample's features never depend on the rest of its batch (a BatchNorm stem over the 8 images of a
    step measured worse, scene questions the most)."""

    def __init__(self, in_channels: int, channels: list[int], out_channels: int, groups: int = 4):
        super().__init__()
        layers: list[nn.Module] = []
        self.stage_ends: list[int] = []  # index in self.layers after which each stage's output is ready
        for c in channels:
            for stride in (2, 1):
                layers += [nn.Conv2d(in_channels, c, 3, stride=stride, padding=1, bias=False),
                           nn.GroupNorm(math.gcd(groups, c), c), nn.ReLU()]
                in_channels = c
            self.stage_ends.append(len(layers) - 1)
        self.layers = nn.Sequential(*layers)
        self.proj = nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        stages, hidden = [], pixel_values
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden)
            if index in self.stage_ends:
                stages.append(hidden)
        return self.proj(hidden), stages

    def reset_parameters(self) -> None:
        """PyTorch's default (Kaiming-uniform) convolution init, with which the stem was measured,
        rather than the ViT's std 0.02."""
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.GroupNorm)):
                module.reset_parameters()


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.patch_size = config.patch_size
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size,
                                         kernel_size=config.patch_size, stride=config.patch_size)
        self.conv_stem = ConvStem(config.num_channels, config.stem_channels, config.hidden_size) \
            if config.stem_channels else None
        self.position_embedding = nn.Embedding(config.num_patches, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False
                ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """-> embeddings ``[N, P, D]`` and the conv stem's stage outputs (None without a stem)."""
        _, _, height, width = pixel_values.shape
        pixel_values = pixel_values.to(self.patch_embedding.weight.dtype)
        patch_embeds = self.patch_embedding(pixel_values)  # [N, D, h, w]
        stem_features = None
        if self.conv_stem is not None:
            stem_embeds, stem_features = self.conv_stem(pixel_values)
            patch_embeds = patch_embeds + stem_embeds  # [N, D, h, w]
        embeddings = patch_embeds.flatten(2).transpose(1, 2)  # [N, h*w, D]
        positions = self.position_embedding.weight  # [P, D]
        if interpolate_pos_encoding:
            positions = resize_position_embeddings(positions, (height // self.patch_size, width // self.patch_size))
        elif embeddings.shape[1] != positions.shape[0]:
            raise ValueError(f"image of {height}x{width} px gives {embeddings.shape[1]} patches but the encoder "
                             f"has {positions.shape[0]} positions; pass interpolate_pos_encoding=True")
        return embeddings + positions, stem_features


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
        self.apply(init_vit_weights)
        if self.embeddings.conv_stem is not None:
            self.embeddings.conv_stem.reset_parameters()

    def forward(self, pixel_values: torch.Tensor, output_attentions: bool = False,
                interpolate_pos_encoding: bool = False) -> SiglipVisionOutput:
        """``pixel_values`` float ``[N, C, S, S]`` already normalised; ``output_attentions`` takes the
        explicit softmax path and returns each layer's attention probabilities."""
        hidden_states, stem_features = self.embeddings(pixel_values, interpolate_pos_encoding)  # [N, P, D]
        hidden_states, attentions = self.encoder(hidden_states, output_attentions)
        return SiglipVisionOutput(self.post_layernorm(hidden_states), attentions, stem_features)


def init_vit_weights(module: nn.Module, std: float = 0.02) -> None:
    """Truncated-normal (std 0.02, cut at 2 std) weights, zero biases, unit LayerNorms."""
    if isinstance(module, (nn.Linear, nn.Conv2d, nn.Embedding)):
        nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


# ---------------------------------------------------------------------------------------------
# Pretrained checkpoints on disk
# ---------------------------------------------------------------------------------------------

# transformers' SiglipVisionConfig defaults: config.json files only list values that differ from them.
_HF_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                       "num_attention_heads": 12, "num_channels": 3, "image_size": 224, "patch_size": 16,
                       "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh"}
_PATCH_KEY = "embeddings.patch_embedding.weight"


def siglip_config_from_pretrained(path: str | os.PathLike, num_attention_heads: int | None = None
                                  ) -> SiglipVisionConfig:
    """The vision config of a checkpoint: from its ``config.json`` (SigLIP, SigLIP-vision or PaliGemma)
    when there is one (in the folder, or beside the weights file), else inferred from the tensor shapes
    (everything but the head count, which must then be given)."""
    config = _config_from_json(Path(path))
    if config is None:
        config = _config_from_shapes(_vision_state_dict(weights_file(Path(path), "SigLIP")), num_attention_heads, path)
    return config


def load_pretrained_siglip(path: str | os.PathLike, image_size: int | None = None,
                           num_attention_heads: int | None = None) -> SiglipVisionModel:
    """Build a :class:`SiglipVisionModel` from a HuggingFace checkpoint on disk.

    ``path``: a folder holding ``config.json`` and ``model.safetensors`` or ``pytorch_model.bin`` (e.g. a
    download of ``google/siglip-base-patch16-224``), or one such weights file (its sizes then come from a
    ``config.json`` beside it, or from the tensor shapes plus ``num_attention_heads``). The vision weights
    are found whatever the layout (``vision_model.`` of SigLIP, ``vision_tower.[vision_model.]`` of
    PaliGemma, or bare), the text tower and pooling head are dropped, and the rest loads with
    ``strict=True``. An ``image_size`` other than the checkpoint's resamples the learned position grid
    once (bicubic), so the encoder then runs natively at that size.
    """
    path = Path(path)
    state_dict = _vision_state_dict(weights_file(path, "SigLIP"))
    config = _config_from_json(path) or _config_from_shapes(state_dict, num_attention_heads, path)
    if image_size is not None and image_size != config.image_size:
        if image_size % config.patch_size:
            raise ValueError(f"{path}: image size {image_size} is not divisible by the checkpoint's patch "
                             f"size {config.patch_size}")
        key = "embeddings.position_embedding.weight"
        grid = (image_size // config.patch_size,) * 2
        state_dict[key] = resize_position_embeddings(state_dict[key].float(), grid).to(state_dict[key].dtype)
        config = replace(config, image_size=image_size)
    model = SiglipVisionModel(config)
    model.load_state_dict(state_dict, strict=True)
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
        raise ValueError(f"{path}: no config.json beside the weights; pass num_attention_heads "
                         f"(the only size that cannot be read from the tensor shapes)")
    hidden_size, num_channels, patch_size, _ = state_dict[_PATCH_KEY].shape
    num_positions = state_dict["embeddings.position_embedding.weight"].shape[0]
    layers = {int(m.group(1)) for k in state_dict if (m := re.match(r"encoder\.layers\.(\d+)\.", k))}
    return SiglipVisionConfig(
        hidden_size=hidden_size, intermediate_size=state_dict["encoder.layers.0.mlp.fc1.weight"].shape[0],
        num_hidden_layers=len(layers), num_attention_heads=num_attention_heads, num_channels=num_channels,
        image_size=math.isqrt(num_positions) * patch_size, patch_size=patch_size)


def _vision_state_dict(file: Path) -> dict[str, torch.Tensor]:
    """The vision-encoder tensors of a checkpoint file, keys relative to :class:`SiglipVisionModel`."""
    tensors = load_tensors(file)
    prefixes = [k[: -len(_PATCH_KEY)] for k in tensors if k.endswith(_PATCH_KEY)]
    if len(prefixes) != 1:
        raise ValueError(f"{file}: expected one SigLIP vision encoder ('*{_PATCH_KEY}'), "
                         f"found {len(prefixes)}")
    prefix = prefixes[0]
    return {k[len(prefix):]: v for k, v in tensors.items()
            if k.startswith(prefix) and not k[len(prefix):].startswith("head.")}
