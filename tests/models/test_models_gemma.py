"""Gemma decoder: RMSNorm, masks, GQA, KV cache, padding, HF parity."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from vlm.config import ParamError
from vlm.models.gemma import GemmaConfig, GemmaForCausalLM, GemmaRMSNorm, KVCache, prefix_lm_mask

SMALL = dict(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2)


def decoder(num_heads=4, num_kv_heads=2, seed=0) -> GemmaForCausalLM:
    torch.manual_seed(seed)
    return GemmaForCausalLM(GemmaConfig(**SMALL, num_attention_heads=num_heads,
                                        num_key_value_heads=num_kv_heads)).eval()


def causal_lm(model: GemmaForCausalLM, ids, mask=None, output_attentions=False):
    """Causal-LM logits ``[B, S, V]`` over right-padded ``ids`` (``mask`` 1 = token; None: all) and the per-layer
    attention probabilities, run as PaliGemma runs the decoder: ``model.model`` over a mask, then the LM head."""
    slots = torch.arange(ids.shape[1]).expand(ids.shape)  # [B, S]
    valid = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    hidden, attentions = model.model(model.model.embed_tokens(ids), slots, prefix_lm_mask(valid, slots),
                                     output_attentions=output_attentions)
    return model.lm_head(hidden), attentions


def padded_prompts(lengths=(5, 3, 7), seed=0):
    """Right-padded prompts of different lengths: ids [B, S], mask [B, S], lengths [B]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(4, 40, (n,), generator=g)
        mask[b, :n] = 1
    return ids, mask, torch.tensor(lengths)


def test_rmsnorm_uses_one_plus_weight_in_float32():
    norm = GemmaRMSNorm(8)
    with torch.no_grad():
        norm.weight.fill_(0.5)
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    x32 = x.float()
    expected = x32 / x32.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * 1.5
    torch.testing.assert_close(out, expected.to(torch.bfloat16))


def test_prefix_lm_mask():
    key_valid = torch.tensor([[True, True, True, True, False]])
    slots = torch.arange(5)[None]
    mask = prefix_lm_mask(key_valid, slots, torch.tensor([2]))[0, 0]
    expected = torch.tensor([[1, 1, 0, 0, 0],   # prefix sees the whole prefix ...
                             [1, 1, 0, 0, 0],
                             [1, 1, 1, 0, 0],   # ... the rest is causal
                             [1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 0]], dtype=torch.bool)  # padding is never seen
    assert torch.equal(mask, expected)
    assert torch.equal(prefix_lm_mask(key_valid, slots)[0, 0], expected.tril())


@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 4), (4, 2), (4, 1), (2, 1)])
def test_explicit_attention_path_matches_fused(num_heads, num_kv_heads):
    model = decoder(num_heads, num_kv_heads)
    ids, mask, _ = padded_prompts()
    fused, _ = causal_lm(model, ids, mask)
    explicit, attentions = causal_lm(model, ids, mask, output_attentions=True)
    torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=0)
    for weights in attentions:
        assert weights.shape == (3, num_heads, 7, 7)
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, num_heads, 7), atol=1e-5, rtol=0)
        assert (weights.triu(1) == 0).all()  # causal


def test_padding_invariance():
    model = decoder()
    ids, mask, lengths = padded_prompts()
    batched, _ = causal_lm(model, ids, mask)
    for b, n in enumerate(lengths.tolist()):
        alone = causal_lm(model, ids[b:b + 1, :n])[0][0]
        torch.testing.assert_close(batched[b, :n], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("prefix_lm", [False, True])
def test_cached_generation_equals_uncached_and_unpadded(prefix_lm):
    model = decoder()
    ids, mask, lengths = padded_prompts()
    embeds = model.model.embed_tokens(ids)
    kwargs = dict(max_new_tokens=6, eos_token_id=-1, prefix_lm=prefix_lm)
    cached = model.generate(embeds, mask.bool(), lengths, use_cache=True, **kwargs)
    uncached = model.generate(embeds, mask.bool(), lengths, use_cache=False, **kwargs)
    assert cached.shape == (3, 6)
    assert torch.equal(cached, uncached)
    for b, n in enumerate(lengths.tolist()):
        alone = model.generate(embeds[b:b + 1, :n], mask[b:b + 1, :n].bool(), lengths[b:b + 1], **kwargs)
        assert torch.equal(alone[0], cached[b])


def test_generation_stops_at_eos_and_pads_after_it():
    model = decoder()
    ids, mask, lengths = padded_prompts()
    embeds = model.model.embed_tokens(ids)
    free = model.generate(embeds, mask.bool(), lengths, max_new_tokens=6, eos_token_id=-1)
    eos = int(free[0, 1])  # make row 0's second token the end-of-sequence token
    stopped = model.generate(embeds, mask.bool(), lengths, max_new_tokens=6, eos_token_id=eos, pad_token_id=0)
    for b in range(3):
        hits = (free[b] == eos).nonzero()
        end = int(hits[0]) + 1 if len(hits) else free.shape[1]
        assert torch.equal(stopped[b, :end], free[b, :end])
        assert (stopped[b, end:] == 0).all()
    assert stopped.shape[1] <= 6


def test_kv_cache_writes_each_row_at_its_own_slot():
    cache = KVCache(num_layers=1, max_length=4)
    key = torch.arange(2 * 1 * 1 * 2, dtype=torch.float32).view(2, 1, 1, 2) + 1
    keys, values = cache.update(0, key, -key, torch.tensor([[1], [3]]))
    assert keys.shape == (2, 1, 4, 2)
    assert torch.equal(keys[0, 0, 1], key[0, 0, 0]) and torch.equal(keys[1, 0, 3], key[1, 0, 0])
    assert keys[0, 0, [0, 2, 3]].abs().sum() == 0 and torch.equal(values, -keys)


def test_gradient_reaches_every_parameter():
    model = decoder().train()
    ids, mask, _ = padded_prompts()
    labels = ids.masked_fill(mask == 0, -100)
    logits, _ = causal_lm(model, ids, mask)  # position t predicts token t + 1
    F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("std", [0.02, 0.1])
def test_initializer_range_sets_the_initial_weight_scale(std):
    torch.manual_seed(0)
    config = GemmaConfig(**{**SMALL, "vocab_size": 512, "num_attention_heads": 4, "initializer_range": std})
    model = GemmaForCausalLM(config)
    weights = torch.cat([model.model.embed_tokens.weight.flatten()] +
                        [layer.mlp.up_proj.weight.flatten() for layer in model.model.layers])
    # truncated at 2 std: the standard deviation of the truncated normal is 0.88 std
    assert weights.std().item() == pytest.approx(0.88 * std, rel=0.05)
    assert weights.abs().max().item() <= 2 * std


@pytest.mark.parametrize("overrides, message", [
    ({"num_attention_heads": 4, "num_key_value_heads": 3},
     "text.num_attention_heads: must be divisible by text.num_key_value_heads (4 % 3 = 1)"),
    ({"hidden_size": 30, "num_attention_heads": 4}, "text.hidden_size: must be divisible by text.num_attention_heads"),
    ({"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 7}, "text.head_dim: must be positive and even"),
    ({"hidden_size": 30, "num_attention_heads": 10, "num_key_value_heads": 1},
     "text.head_dim: must be positive and even for rotary embeddings, got 3"),
    ({"initializer_range": 0.0}, "text.initializer_range: must be positive, got 0.0"),
])
def test_invalid_config_names_the_key(overrides, message):
    with pytest.raises(ParamError) as e:
        GemmaConfig(**{**SMALL, **overrides}).validate("text")
    assert message in str(e.value)


# ---------------------------------------------------------------- HuggingFace parity


def hf_gemma(transformers, num_heads: int, num_kv_heads: int, head_dim: int, vocab_size: int = 40,
             rope_theta: float = 10000.0):
    """A HF GemmaForCausalLM of SMALL's sizes with random (not initial) weights."""
    torch.manual_seed(0)
    hf_config = transformers.GemmaConfig(**{**SMALL, "vocab_size": vocab_size}, num_attention_heads=num_heads,
                                         num_key_value_heads=num_kv_heads, head_dim=head_dim, rope_theta=rope_theta,
                                         attn_implementation="eager")
    hf = transformers.GemmaForCausalLM(hf_config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return hf


# head_dim 16 with hidden 32 and 4 heads: the projections map 32 <-> 64, as Gemma-7B's map 3072 <-> 16 x 256
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(4, 4, 8), (4, 2, 8), (4, 1, 8), (4, 2, 16), (2, 1, 6)])
def test_matches_hf_gemma_for_causal_lm(transformers, num_heads, num_kv_heads, head_dim):
    hf = hf_gemma(transformers, num_heads, num_kv_heads, head_dim)
    ours = GemmaForCausalLM(GemmaConfig(**SMALL, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                                        head_dim=head_dim)).eval()
    assert ours.model.layers[0].self_attn.q_proj.weight.shape == (num_heads * head_dim, 32)
    ours.load_state_dict(hf.state_dict(), strict=True)
    ids, mask, lengths = padded_prompts()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).logits
        got, _ = causal_lm(ours, ids, mask)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(got[b, :n], expected[b, :n], atol=1e-4, rtol=0)


def test_output_slots_compute_only_those_tokens():
    model = decoder()
    ids, mask, _ = padded_prompts()
    embeds = model.model.embed_tokens(ids)
    slots = torch.arange(7).expand(3, 7)
    attention = prefix_lm_mask(mask.bool(), slots, torch.tensor([2, 2, 2]))
    full, _ = model.model(embeds, slots, attention)
    wanted = torch.tensor([[4, 5, 6], [0, 3, 3], [6, 1, 2]])  # any slots per row, in any order, repeated
    some, _ = model.model(embeds, slots, attention, output_slots=wanted)
    assert some.shape == (3, 3, 32)
    torch.testing.assert_close(some, full.gather(1, wanted[..., None].expand(-1, -1, 32)), atol=1e-6, rtol=0)


def test_head_dim_defaults_to_hidden_size_over_heads_and_may_differ():
    assert GemmaConfig(**SMALL, num_attention_heads=4).head_dim == 8
    assert GemmaConfig(**SMALL, num_attention_heads=4, head_dim=16).head_dim == 16
    GemmaConfig(**{**SMALL, "hidden_size": 30}, num_attention_heads=4, num_key_value_heads=2, head_dim=8).validate()


@pytest.mark.parametrize("safe_serialization, shard", [(True, None), (False, None), (True, "20KB")])
def test_a_saved_hf_gemma_loads_into_the_decoder(transformers, tmp_path, safe_serialization, shard):
    from vlm.models.gemma import gemma_config_from_pretrained, load_pretrained_gemma

    hf = hf_gemma(transformers, 4, 2, 16, rope_theta=500.0)  # written in config.json's rope_parameters
    hf.save_pretrained(tmp_path, safe_serialization=safe_serialization, **{"max_shard_size": shard} if shard else {})
    assert (tmp_path / "model.safetensors.index.json").is_file() == bool(shard)  # shards, as Gemma-2B's download
    config = gemma_config_from_pretrained(tmp_path)
    assert (config.head_dim, config.num_attention_heads, config.num_key_value_heads) == (16, 4, 2)
    assert config.rope_theta == 500.0
    ours = load_pretrained_gemma(tmp_path).eval()
    ids, mask, lengths = padded_prompts()
    with torch.no_grad():
        expected, got = hf(input_ids=ids, attention_mask=mask).logits, causal_lm(ours, ids, mask)[0]
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(got[b, :n], expected[b, :n], atol=1e-4, rtol=0)

    # Another vocabulary (this project's tokenizer): fresh token embeddings, every other weight the checkpoint's.
    other = load_pretrained_gemma(tmp_path, vocab_size=57)
    assert other.model.embed_tokens.weight.shape == (57, 32) and other.lm_head.weight is other.model.embed_tokens.weight
    for key, value in hf.state_dict().items():
        if "embed_tokens" not in key and key != "lm_head.weight":
            assert torch.equal(other.state_dict()[key], value), key


def test_a_damaged_or_foreign_decoder_checkpoint_is_a_clear_error(transformers, tmp_path):
    from vlm.models.gemma import load_pretrained_gemma

    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained_gemma(tmp_path)
    hf_gemma(transformers, 4, 2, 8).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match="not the decoder its config.json describes: Missing key") as error:
        load_pretrained_gemma(tmp_path)
    assert "\n" not in str(error.value)
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_activation": "relu"}))
    with pytest.raises(ValueError, match="hidden activation 'relu' is not Gemma's gelu_pytorch_tanh"):
        load_pretrained_gemma(tmp_path)
    scaled = {**config, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}
    (tmp_path / "config.json").write_text(json.dumps(scaled))
    with pytest.raises(ValueError, match="config.json: RoPE type 'linear': this decoder computes Gemma's default"):
        load_pretrained_gemma(tmp_path)
