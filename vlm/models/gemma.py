"""Gemma-style decoder, parameter-compatible with HuggingFace ``GemmaForCausalLM`` (docs/architecture.md, the model).
Masks are boolean ``[B, 1, Q, K]`` (True: may attend), built once per forward (:func:`prefix_lm_mask`). Tokens have
*slots* (index in the keys or the cache) and *positions* (RoPE), different only where continuations share a prefix."""

import dataclasses
import logging
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vlm.config import check
from vlm.models.attention import attention, init_weights
from vlm.models.pretrained import load_strict, read_config, sub_model_tensors, weights_files

log = logging.getLogger(__name__)


@dataclass
class GemmaConfig:
    vocab_size: int = 256
    hidden_size: int = 192
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 3
    num_key_value_heads: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    initializer_range: float = 0.02  # std of the initial projections and embeddings (HF's name)
    head_dim: int | None = None  # None: hidden_size / heads; as in HF it may differ (Gemma-7B: 3072, 16 x 256)

    def __post_init__(self):
        if self.head_dim is None and self.num_attention_heads > 0 and self.hidden_size % self.num_attention_heads == 0:
            self.head_dim = self.hidden_size // self.num_attention_heads

    def validate(self, prefix: str = "GemmaConfig") -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "rms_norm_eps", "rope_theta", "initializer_range"):
            check(getattr(self, name) > 0, f"{prefix}.{name}", f"must be positive, got {getattr(self, name)}")
        check(self.head_dim is not None, f"{prefix}.hidden_size", f"must be divisible by {prefix}.num_attention_heads "
              f"({self.hidden_size} % {self.num_attention_heads} = {self.hidden_size % self.num_attention_heads}) "
              f"unless {prefix}.head_dim is set")
        check(self.num_attention_heads % self.num_key_value_heads == 0, f"{prefix}.num_attention_heads",
              f"must be divisible by {prefix}.num_key_value_heads ({self.num_attention_heads} % "
              f"{self.num_key_value_heads} = {self.num_attention_heads % self.num_key_value_heads})")
        check(self.head_dim > 0 and self.head_dim % 2 == 0, f"{prefix}.head_dim",
              f"must be positive and even for rotary embeddings, got {self.head_dim}")


def prefix_lm_mask(key_valid: torch.Tensor, query_slots: torch.Tensor,
                   prefix_lengths: torch.Tensor | None = None, isolated: int = 0) -> torch.Tensor:
    """Boolean attention mask ``[B, 1, Q, K]``: a query sees every valid key at or before its slot and of the first
    ``prefix_lengths[b]`` slots (None: purely causal), but one in the first ``isolated`` slots sees those only.
    ``key_valid`` ``[B, K]``: False on padding and empty cache slots; ``query_slots`` ``[B, Q]``: each query's slot."""
    key_slots = torch.arange(key_valid.shape[1], device=key_valid.device)  # [K]
    visible = key_slots <= query_slots[:, :, None]  # [B, Q, K]
    if prefix_lengths is not None:
        visible = visible | (key_slots < prefix_lengths[:, None, None])
    if isolated:
        visible = visible & ((query_slots[:, :, None] >= isolated) | (key_slots < isolated))
    return (visible & key_valid[:, None, :])[:, None]


class KVCache:
    """Preallocated keys and values, a ``[B, H_kv, max_length, Dh]`` buffer pair per layer, allocated on first use in
    the layer's dtype (bf16 under autocast); each new token goes to its own slot (right-padded prompts need no
    re-alignment), a mask hiding the empty ones."""

    def __init__(self, num_layers: int, max_length: int):
        self.max_length = max_length
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def update(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor):
        """Write ``key``/``value`` ``[B, H_kv, Q, Dh]`` at ``slots`` ``[B, Q]``; return the full buffers."""
        if self.keys[layer_idx] is None:
            shape = (key.shape[0], key.shape[1], self.max_length, key.shape[3])
            self.keys[layer_idx] = key.new_zeros(shape)
            self.values[layer_idx] = value.new_zeros(shape)
        index = slots[:, None, :, None].expand_as(key)  # [B, H_kv, Q, Dh]
        self.keys[layer_idx].scatter_(2, index, key)
        self.values[layer_idx].scatter_(2, index, value)
        return self.keys[layer_idx], self.values[layer_idx]


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # pointwise ops only, which autocast leaves alone: float32 statistics under bf16 autocast
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)


class GemmaScaledEmbedding(nn.Embedding):
    """Token embeddings multiplied by ``sqrt(hidden_size)`` (Gemma's normaliser)."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embedding_dim**0.5


class GemmaRotaryEmbedding(nn.Module):
    def __init__(self, config: GemmaConfig):
        super().__init__()
        exponents = torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim
        self.register_buffer("inv_freq", 1.0 / config.rope_theta**exponents, persistent=False)  # [Dh/2]

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor):
        freqs = position_ids[..., None].float() * self.inv_freq  # [B, S, Dh/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [B, S, Dh]
        return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, S, Dh]`` by the angles of ``cos``/``sin`` ``[B, S, Dh]``."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return x * cos + rotate_half(x) * sin


class GemmaAttention(nn.Module):
    def __init__(self, config: GemmaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, hidden_states: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor, cache: KVCache | None = None, cache_slots: torch.Tensor | None = None,
                output_attentions: bool = False, query_slots: torch.Tensor | None = None):
        """Self-attention of the tokens at ``query_slots`` ``[B, Q]`` (None: all) over all of ``hidden_states``."""
        batch, length, _ = hidden_states.shape
        cos, sin = rotary
        queries, cos_q, sin_q = hidden_states, cos, sin
        if query_slots is not None:
            queries, cos_q, sin_q = (gather_slots(t, query_slots) for t in (hidden_states, cos, sin))
            attention_mask = gather_slots(attention_mask[:, 0], query_slots)[:, None]  # [B, 1, Q, K]
        query = self.q_proj(queries).view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)
        key = self.k_proj(hidden_states).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        value = self.v_proj(hidden_states).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        query = apply_rotary(query, cos_q, sin_q)  # [B, H, Q, Dh]
        key = apply_rotary(key, cos, sin)  # [B, H_kv, S, Dh]
        if cache is not None:
            key, value = cache.update(self.layer_idx, key, value, cache_slots)  # [B, H_kv, K, Dh]
        attn_output, weights = attention(query, key, value, attention_mask, output_attentions)  # [B, H, Q, Dh]
        attn_output = attn_output.transpose(1, 2).reshape(batch, queries.shape[1], -1)  # [B, Q, H*Dh]
        return self.o_proj(attn_output), weights


def gather_slots(values: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``values[b, slots[b, q]]``: ``[B, S, ...]`` -> ``[B, Q, ...]``."""
    index = slots.view(*slots.shape, *([1] * (values.dim() - 2))).expand(-1, -1, *values.shape[2:])
    return values.gather(1, index)


class GemmaMLP(nn.Module):
    def __init__(self, config: GemmaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: GemmaConfig, layer_idx: int):
        super().__init__()
        self.self_attn = GemmaAttention(config, layer_idx)
        self.mlp = GemmaMLP(config)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, rotary, attention_mask, cache=None, cache_slots=None, output_attentions=False,
                output_slots: torch.Tensor | None = None):
        """Pre-norm attention and MLP; only the tokens at ``output_slots`` ``[B, Q]`` (None: all) are computed."""
        attn_output, weights = self.self_attn(self.input_layernorm(hidden_states), rotary, attention_mask,
                                              cache, cache_slots, output_attentions, query_slots=output_slots)
        if output_slots is not None:
            hidden_states = gather_slots(hidden_states, output_slots)
        hidden_states = hidden_states + attn_output
        hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states, weights


class GemmaModel(nn.Module):
    """Embeddings + decoder layers + final norm (no LM head)."""

    def __init__(self, config: GemmaConfig):
        super().__init__()
        self.embed_tokens = GemmaScaledEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = GemmaRotaryEmbedding(config)

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                cache: KVCache | None = None, cache_slots: torch.Tensor | None = None,
                output_attentions: bool = False, output_slots: torch.Tensor | None = None):
        """``inputs_embeds`` ``[B, S, D]`` (scaled), ``position_ids`` ``[B, S]``, ``attention_mask`` ``[B, 1, S, K]``;
        with a ``cache``, ``cache_slots`` ``[B, S]``. Returns the normed hidden states ``[B, Q, D]`` at ``output_slots``
        ``[B, Q]`` (None: all; the last layer computes only those) and the per-layer attention probabilities."""
        rotary = self.rotary_emb(position_ids)
        hidden_states = inputs_embeds
        attentions = []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            hidden_states, weights = layer(hidden_states, rotary, attention_mask, cache, cache_slots,
                                           output_attentions, output_slots if i == last else None)
            attentions.append(weights)
        return self.norm(hidden_states), tuple(attentions) if output_attentions else None


class GemmaForCausalLM(nn.Module):
    """The decoder (``model``) and its tied LM head, which PaliGemma runs itself; :meth:`generate` decodes."""

    def __init__(self, config: GemmaConfig):
        super().__init__()
        config.validate()
        self.config = config
        self.model = GemmaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.apply(partial(init_weights, std=config.initializer_range))
        self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def generate(self, inputs_embeds: torch.Tensor, key_valid: torch.Tensor, lengths: torch.Tensor,
                 max_new_tokens: int, eos_token_id: int, pad_token_id: int = 0, prefix_lm: bool = False,
                 use_cache: bool = True, isolated: int = 0) -> torch.Tensor:
        """Greedy decoding after right-padded prompts ``inputs_embeds`` ``[B, S, D]`` (``key_valid`` ``[B, S]``,
        ``lengths`` ``[B]``): new token t of row b goes to slot ``lengths[b] + t``. With ``prefix_lm`` the prompt
        attends to itself in full, but for its first ``isolated`` slots (:func:`prefix_lm_mask`). Returns ``[B, T]``
        ids, T <= max_new_tokens, a row ending at its first ``eos_token_id`` and padded with ``pad_token_id``."""
        batch, prompt_length, _ = inputs_embeds.shape
        device = inputs_embeds.device
        total = prompt_length + max_new_tokens
        rows = torch.arange(batch, device=device)
        valid = torch.zeros(batch, total, dtype=torch.bool, device=device)  # [B, K]
        valid[:, :prompt_length] = key_valid
        prefix_lengths = lengths if prefix_lm else None
        all_slots = torch.arange(total, device=device).expand(batch, total)
        if use_cache:
            cache = KVCache(self.config.num_hidden_layers, total)
        else:  # recompute everything each step over a buffer holding prompt and new tokens
            cache = None
            sequence = inputs_embeds.new_zeros(batch, total, inputs_embeds.shape[2])  # [B, K, D]
            sequence[:, :prompt_length] = inputs_embeds

        step_embeds = inputs_embeds
        step_slots = all_slots[:, :prompt_length]
        read_slots = lengths - 1  # slot whose output predicts the next token
        generated, finished = [], torch.zeros(batch, dtype=torch.bool, device=device)
        for step in range(max_new_tokens):
            if cache is not None:
                mask = prefix_lm_mask(valid, step_slots, prefix_lengths, isolated)
                hidden, _ = self.model(step_embeds, step_slots, mask, cache, step_slots)
                hidden = hidden[rows, read_slots - step_slots[:, 0]]  # [B, D]
            else:
                hidden, _ = self.model(sequence, all_slots, prefix_lm_mask(valid, all_slots, prefix_lengths, isolated))
                hidden = hidden[rows, read_slots]
            next_token = self.lm_head(hidden).argmax(-1)  # [B]
            generated.append(torch.where(finished, pad_token_id, next_token))
            finished = finished | (next_token == eos_token_id)
            if bool(finished.all()) or step == max_new_tokens - 1:
                break
            read_slots = lengths + step  # the new token's slot
            valid[rows, read_slots] = True
            step_embeds = self.model.embed_tokens(next_token)[:, None]  # [B, 1, D]
            step_slots = read_slots[:, None]
            if cache is None:
                sequence[rows, read_slots] = step_embeds[:, 0]
        return torch.stack(generated, dim=1)


# transformers' GemmaConfig defaults (Gemma-7B): a saved config.json lists only the values that differ from them.
_HF_GEMMA_DEFAULTS = {"vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
                      "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "rms_norm_eps": 1e-6,
                      "rope_theta": 10000.0, "initializer_range": 0.02}
_EMBED_KEY = "model.embed_tokens.weight"


def gemma_config_from_pretrained(path: str | os.PathLike) -> GemmaConfig:
    """The decoder config of a saved HF ``GemmaForCausalLM`` (or PaliGemma: its ``text_config``) folder."""
    if not Path(path).exists():
        raise FileNotFoundError(f"Gemma checkpoint not found: {path}")
    found = read_config(Path(path))
    if found is None:
        raise FileNotFoundError(f"{path}: no config.json (a folder saved by GemmaForCausalLM.save_pretrained)")
    config_file, raw = found
    text = raw.get("text_config", raw)
    activation = text.get("hidden_activation") or text.get("hidden_act") or "gelu_pytorch_tanh"
    if activation != "gelu_pytorch_tanh":
        raise ValueError(f"{config_file}: hidden activation {activation!r} is not Gemma's gelu_pytorch_tanh")
    values = {**_HF_GEMMA_DEFAULTS, **{k: text[k] for k in _HF_GEMMA_DEFAULTS if text.get(k) is not None}}
    # RoPE: transformers 5 writes {"rope_parameters": {"rope_type": "default", "rope_theta": ...}} (vlm.export too);
    # 4.x a top-level rope_theta and, for scaled RoPE, "rope_scaling"
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"{config_file}: RoPE type {rope_type!r}: this decoder computes Gemma's default RoPE only")
    if rope.get("rope_theta") is not None:
        values["rope_theta"] = rope["rope_theta"]
    return GemmaConfig(**values)


def load_pretrained_gemma(path: str | os.PathLike, vocab_size: int | None = None) -> GemmaForCausalLM:
    """A :class:`GemmaForCausalLM` from a saved HF ``GemmaForCausalLM`` (or PaliGemma) checkpoint, every weight loaded
    strictly; with another ``vocab_size`` (the tokenizer's) the token embeddings and tied LM head stay fresh."""
    path = Path(path)
    config = gemma_config_from_pretrained(path)
    files = weights_files(path, "Gemma")
    file = files[0] if len(files) == 1 else path  # what the errors name
    state_dict = sub_model_tensors(files, _EMBED_KEY, "Gemma decoder")
    if state_dict[_EMBED_KEY].shape != (config.vocab_size, config.hidden_size):
        raise ValueError(f"{file}: {_EMBED_KEY} {tuple(state_dict[_EMBED_KEY].shape)} does not match its "
                         f"config.json ({config.vocab_size}, {config.hidden_size})")
    if vocab_size is not None and vocab_size != config.vocab_size:
        log.info("%s: vocabulary of %d tokens, the tokenizer has %d: the token embeddings start fresh", path,
                 config.vocab_size, vocab_size)
        config = dataclasses.replace(config, vocab_size=vocab_size)
    model = GemmaForCausalLM(config)
    if config.vocab_size != state_dict[_EMBED_KEY].shape[0]:
        state_dict[_EMBED_KEY] = model.model.embed_tokens.weight.detach()
    state_dict["lm_head.weight"] = state_dict[_EMBED_KEY]  # tied
    load_strict(model, state_dict, f"{file}: not the decoder its config.json describes")
    return model
