"""Q-Former connector: query count, cross-attention placement, gradients, BLIP-2 parity."""

from __future__ import annotations

import pytest
import torch

from vlm.config import ParamError
from vlm.models.qformer import QFormerConfig, QFormerConnector

CONFIG = dict(num_query_tokens=4, hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32,
              cross_attention_freq=2)


def connector(**overrides) -> QFormerConnector:
    torch.manual_seed(0)
    return QFormerConnector(QFormerConfig(**{**CONFIG, **overrides}), vision_hidden_size=24,
                            text_hidden_size=40).eval()


@pytest.mark.parametrize("num_patches", [16, 49])
def test_outputs_one_token_per_query_whatever_the_patch_count(num_patches):
    out = connector()(torch.randn(3, num_patches, 24))
    assert out.shape == (3, 4, 40)


@pytest.mark.parametrize("freq, with_cross", [(1, [0, 1, 2, 3]), (2, [0, 2]), (3, [0, 3])])
def test_cross_attention_every_freq_layers(freq, with_cross):
    layers = connector(cross_attention_freq=freq).qformer.encoder.layer
    assert [i for i, layer in enumerate(layers) if layer.crossattention is not None] == with_cross


def test_queries_read_the_image_and_learn():
    model = connector().train()
    features = torch.randn(2, 16, 24, requires_grad=True)
    out = model(features)
    assert not torch.allclose(out[0], out[1])  # different images, different tokens
    out.pow(2).mean().backward()
    assert features.grad.abs().sum() > 0
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_invalid_config_names_the_key():
    with pytest.raises(ParamError, match=r"model.qformer.hidden_size: must be divisible by "
                                         r"model.qformer.num_attention_heads \(16 % 3 = 1\)"):
        QFormerConfig(**{**CONFIG, "num_attention_heads": 3}).validate("model.qformer")


def test_matches_hf_blip2_qformer(transformers):
    torch.manual_seed(0)
    hf_config = transformers.Blip2QFormerConfig(hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
                                                intermediate_size=32, cross_attention_frequency=2,
                                                encoder_hidden_size=24, attn_implementation="eager")
    hf = transformers.Blip2QFormerModel(hf_config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = connector().qformer
    ours.load_state_dict(hf.state_dict(), strict=True)
    queries, features = torch.randn(3, 4, 16), torch.randn(3, 16, 24)
    with torch.no_grad():
        expected = hf(query_embeds=queries, encoder_hidden_states=features).last_hidden_state
        torch.testing.assert_close(ours(queries, features), expected, atol=1e-5, rtol=0)
