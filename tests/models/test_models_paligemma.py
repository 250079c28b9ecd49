"""The PaliGemma core: configs from params, the Batch contract, prefix-LM attention, padding, answer/generate,
attention maps, autocast, and parity with HuggingFace PaliGemma."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from vlm.batch import Batch
from vlm.config import ParamError
from vlm.models.paligemma import PaliGemma, PaliGemmaConfig, load_pretrained
from vlm.models.siglip import SiglipVisionConfig, SiglipVisionModel
from vlm.train import compile_layers

VOCAB_SIZE, EOS, YES, NO = 40, 3, 4, 5  # as in conftest.tiny_config and the tokenizer contract
CANDIDATES = [[YES, EOS], [NO, EOS], [12, EOS], [13, 14, EOS], [15]]


def build(config, seed=0, **overrides) -> PaliGemma:
    torch.manual_seed(seed)
    return PaliGemma(config(**overrides)).eval()


def inputs(batch: Batch) -> Batch:
    return replace(batch, labels=None, targets=None)


# ---------------------------------------------------------------- configuration


def test_from_params_builds_the_default_model_config():
    import numpy as np

    config = PaliGemmaConfig.from_params({}, vocab_size=np.int64(57), image_size=128,
                                   image_mean=np.array([0.3, 0.4, 0.5], dtype=np.float32),
                                   image_std=[0.2, 0.2, 0.2])
    assert config.gemma.vocab_size == 57 and config.siglip.image_size == 128
    assert config.num_image_tokens == 64 and config.image_mean == pytest.approx([0.3, 0.4, 0.5])
    assert PaliGemmaConfig.from_dict(config.to_dict()) == config
    qformer = PaliGemmaConfig.from_params({"connector": "qformer", "qformer": {"num_query_tokens": 8}}, 57, 128)
    assert qformer.num_image_tokens == 8
    assert PaliGemmaConfig.from_params({"vision": "none"}, 57, 128).num_image_tokens == 0
    # the blind baseline of a patch-14 VLM: its frames (224 x 392) need not fit the unused encoder's default patch 16
    blind = PaliGemmaConfig.from_params({"vision": "none"}, 57, 224, image_width=392)
    assert PaliGemmaConfig.from_dict(blind.to_dict()) == blind and blind.siglip.height_width == (224, 392)
    with pytest.raises(ParamError, match=r"model.siglip.patch_size: must divide the image size of the data \(392 % 16"):
        PaliGemmaConfig.from_params({}, 57, 224, image_width=392)


@pytest.mark.parametrize("section, message", [
    ({"siglip": {"hidden_size": 190}},
     "model.siglip.hidden_size: must be divisible by model.siglip.num_attention_heads (190 % 3 = 1)"),
    ({"gemma": {"num_key_value_heads": 2}},
     "model.gemma.num_attention_heads: must be divisible by model.gemma.num_key_value_heads (3 % 2 = 1)"),
    ({"qformer": {"num_attention_heads": 5}}, "model.qformer.hidden_size: must be divisible by"),
    ({"siglip": {"patch_size": 24}}, "model.siglip.patch_size: must divide the image size of the data (128 % 24 = 8)"),
    ({"gemma": {"vocab_size": 10}}, "model.gemma.vocab_size: set from the vocabulary size"),
    ({"siglip": {"image_size": 64}}, "model.siglip.image_size: set from the packed image size"),
    ({"siglip": {"num_channels": 1}}, "model.siglip.num_channels: set from the packed images, which are RGB"),
    ({"gemma": {"layers": 2}}, "model.gemma.layers: unknown key"),
    ({"gemma": {"num_hidden_layers": "4"}}, "model.gemma.num_hidden_layers: must be an integer"),
    ({"connector": "mlp"}, "model.connector: must be one of 'linear', 'qformer'"),
    ({"qformer": 3}, "model.qformer: must be a mapping"),
    ({"vision_checkpoint": "/no/such/siglip"}, "model.vision_checkpoint: SigLIP checkpoint not found"),
])
def test_from_params_rejects_bad_values_naming_the_key(section, message):
    with pytest.raises(ParamError) as e:
        PaliGemmaConfig.from_params(section, vocab_size=57, image_size=128)
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
        PaliGemmaConfig.from_params(section, VOCAB_SIZE, 36)
    cfg = PaliGemmaConfig.from_params(section, VOCAB_SIZE, image_size=32, image_mean=[0.1] * 3, image_std=[0.2] * 3)
    assert cfg.siglip == SiglipVisionConfig(**{**vision, "image_size": 32})
    assert cfg.image_mean == [0.5] * 3  # the checkpoint's own normalisation, not the data's
    model = load_pretrained(PaliGemma(cfg))
    assert model.vision_tower.embeddings.position_embedding.weight.shape == (16, 32)  # 8x8 grid resampled to 4x4
    for key, value in source.state_dict().items():
        if "position_embedding" not in key:
            assert torch.equal(model.vision_tower.state_dict()[key], value), key


def test_pretrained_gemma_checkpoint_starts_the_decoder(transformers, tmp_path, config):
    torch.manual_seed(2)
    hf = transformers.GemmaForCausalLM(transformers.GemmaConfig(
        vocab_size=1000, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16))
    hf.save_pretrained(tmp_path)
    section = {"decoder_checkpoint": str(tmp_path), "gemma": {"hidden_size": 64}}  # not used: the checkpoint's
    cfg = PaliGemmaConfig.from_params(section, VOCAB_SIZE, image_size=32)
    assert (cfg.gemma.hidden_size, cfg.gemma.head_dim, cfg.gemma.vocab_size) == (32, 16, VOCAB_SIZE)
    model = load_pretrained(PaliGemma(cfg))
    decoder = model.language_model.state_dict()
    for key, value in hf.state_dict().items():
        if "embed_tokens" not in key and key != "lm_head.weight":  # a 1000-token vocabulary is not ours
            assert torch.equal(decoder[key], value), key
    blind = PaliGemmaConfig.from_params({"vision": "none", "decoder_checkpoint": str(tmp_path)}, VOCAB_SIZE, 32)
    assert blind.gemma == cfg.gemma
    with pytest.raises(ParamError, match="model.decoder_checkpoint: Gemma checkpoint not found"):
        PaliGemmaConfig.from_params({"decoder_checkpoint": str(tmp_path / "none")}, VOCAB_SIZE, 32)


# ---------------------------------------------------------------- forward and the Batch contract


@pytest.mark.parametrize("connector, image_tokens", [("linear", 16), ("qformer", 4)])
def test_forward_returns_text_logits_and_answer_loss(config, make_batch, connector, image_tokens):
    model = build(config, connector=connector)
    batch = make_batch(model.config)
    out = model(batch)
    assert model.num_image_tokens == image_tokens
    assert out.logits.shape == (*batch.input_ids.shape, VOCAB_SIZE)
    # mean cross-entropy over the answer tokens only, logits at t predicting token t + 1
    log_probs = out.logits.log_softmax(-1)
    targets = batch.labels[:, 1:]
    picked = log_probs[:, :-1].gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    expected = -picked[targets != -100].mean()
    torch.testing.assert_close(out.losses["answer"], expected)
    assert model(inputs(batch)).losses == {}


@pytest.mark.parametrize("vision", ["siglip", "none"])
def test_answer_only_gives_the_same_loss_and_gradients_from_the_answer_positions(config, make_batch, vision):
    model = build(config, vision=vision).train()
    batch = make_batch(model.config)
    full = model(batch)
    full.losses["answer"].backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    answer = model(batch, answer_only=True)
    answer.losses["answer"].backward()
    torch.testing.assert_close(answer.losses["answer"], full.losses["answer"], atol=1e-6, rtol=0)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], atol=1e-6, rtol=1e-5, msg=name)
    lengths = (batch.labels != -100).sum(1)
    assert answer.logits.shape == (len(batch), int(lengths.max()), VOCAB_SIZE)
    for b, n in enumerate(lengths.tolist()):  # column a predicts answer token a, as position prefix - 1 + a did
        start = int(batch.prefix_lengths[b]) - 1
        torch.testing.assert_close(answer.logits[b, :n], full.logits[b, start:start + n], atol=1e-5, rtol=0)
    labels = batch.labels.clone()
    labels[0, 0] = 7  # a labelled token inside the prefix: answer_only would drop it
    with pytest.raises(ValueError, match="inside the prefix"):
        model(replace(batch, labels=labels), answer_only=True)


@pytest.mark.parametrize("connector", ["linear", "qformer"])
def test_gradient_reaches_every_parameter(config, make_batch, connector):
    model = build(config, connector=connector).train()
    model(make_batch(model.config)).losses["answer"].backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_each_distinct_image_is_encoded_once(config, make_batch):
    model = build(config)
    batch = make_batch(model.config, batch=6, num_images=2)
    seen = []
    model.vision_tower.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    shared = model(batch).logits
    assert seen == [2]
    duplicated = replace(batch, images=batch.images[batch.image_index], image_index=torch.arange(6))
    torch.testing.assert_close(model(duplicated).logits, shared, atol=1e-5, rtol=0)


def test_answer_tokens_never_see_later_tokens(config, make_batch):
    model = build(config)
    batch = make_batch(model.config)
    base = model(batch).logits
    b = 3  # a row with a two-token answer
    start, end = int(batch.prefix_lengths[b]), int(batch.attention_mask[b].sum())
    for changed in range(start, end):
        ids = batch.input_ids.clone()
        ids[b, changed] = 1 if ids[b, changed] != 1 else 2
        logits = model(replace(batch, input_ids=ids)).logits
        torch.testing.assert_close(logits[b, :changed], base[b, :changed], atol=1e-6, rtol=0)
        assert not torch.allclose(logits[b, changed], base[b, changed], atol=1e-4)
        torch.testing.assert_close(logits[:b], base[:b], atol=1e-6, rtol=0)  # other rows untouched


def test_the_prefix_sees_the_whole_prefix(config, make_batch):
    model = build(config)
    batch = make_batch(model.config)
    base = model(batch).logits
    b = 3
    ids = batch.input_ids.clone()
    ids[b, int(batch.prefix_lengths[b]) - 2] += 1  # the last question word
    logits = model(replace(batch, input_ids=ids)).logits
    assert not torch.allclose(logits[b, 0], base[b, 0], atol=1e-4)  # [SOS] sees it: full attention in the prefix
    # the image tokens see the question too, so an image change reaches the first text position
    images = batch.images.clone()
    images[batch.image_index[b]] = 255 - images[batch.image_index[b]]
    assert not torch.allclose(model(replace(batch, images=images)).logits[b, 0], base[b, 0], atol=1e-4)


@pytest.mark.parametrize("vision", ["siglip", "none"])
def test_packed_rows_give_each_question_its_loss_and_gradients_alone(config, make_batch, row, vision):
    """One decoder row per image (pack_questions): each question's answer loss and its gradients are those it
    has alone, in a row [image | question answer] of its own, as answer_only's are tested above."""
    model = build(config, vision=vision, pack_questions=True).train()
    batch = make_batch(model.config, batch=7, num_images=3)  # rows of 3, 2 and 2 questions, interleaved
    assert model(batch, answer_only=True).logits.shape[:2] == (7, 3)  # answers of up to 3 tokens
    for b in range(len(batch)):
        single = row(batch, b)
        alone = model(single, answer_only=True)
        alone.losses["answer"].backward()
        expected = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.zero_grad()
        start = int(batch.prefix_lengths[b])
        labels = batch.labels[b, start:start + alone.logits.shape[1]]
        packed = F.cross_entropy(model(batch, answer_only=True).logits[b, :len(labels)], labels)
        packed.backward()
        torch.testing.assert_close(packed, alone.losses["answer"], atol=1e-6, rtol=0)
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, expected[name], atol=1e-6, rtol=1e-5, msg=f"question {b}: {name}")
        model.zero_grad()


@pytest.mark.parametrize("vision, reads", [("siglip", 3), ("none", 4)])
def test_a_packed_training_pass_reads_the_device_before_the_image_tokens_only(config, make_batch, vision, reads):
    """On a GPU each read back to the host (a value, or a size that depends on the data) waits for all queued work:
    the packed forward and backward read the answers' length and the layout's token places and row sizes (the
    blind model its row count too), all before the image tokens, and nothing after them."""
    from benchmarks.bench_train_step import OperatorCount

    model = build(config, vision=vision, pack_questions=True).train()
    batch = make_batch(model.config, batch=7, num_images=3)
    counter, encode_images = OperatorCount(), model.encode_images

    def encode_images_then_count_apart(*args, **kwargs):
        counter.phase = "the image tokens and after"
        return encode_images(*args, **kwargs)

    model.encode_images = encode_images_then_count_apart
    with counter:
        counter.phase = "before the image tokens"
        model(batch, answer_only=True).losses["answer"].backward()
    assert counter.reads == {"before the image tokens": reads}
    assert counter.counts["the image tokens and after" if vision == "siglip" else "before the image tokens"] > 100


def test_packed_image_tokens_ignore_the_questions(config, make_batch):
    """With pack_questions the image tokens attend to each other only: what a question reads of its image does
    not depend on its words (PaliGemma's prefix lets them see the question)."""
    batch = make_batch(config(), batch=1, num_images=1)
    changed = batch.input_ids.clone()
    changed[0, 1] += 1  # the first question word
    for pack_questions, same in ((True, True), (False, False)):
        model = build(config, pack_questions=pack_questions)
        hidden = []
        model.language_model.model.layers[1].register_forward_pre_hook(lambda m, a, seen=hidden: seen.append(a[0]))
        for ids in (batch.input_ids, changed):
            model(replace(batch, input_ids=ids))
        image_states = [h[0, :model.num_image_tokens] for h in hidden]  # the image slots after layer 0
        assert torch.allclose(*image_states, atol=1e-6) is same, pack_questions


@pytest.mark.parametrize("connector, pack_questions", [("linear", False), ("qformer", False), ("linear", True),
                                                       ("qformer", True)])
def test_padded_batch_matches_each_question_alone(config, make_batch, row, connector, pack_questions):
    model = build(config, connector=connector, pack_questions=pack_questions)
    batch = make_batch(model.config)
    logits = model(batch).logits
    probs = model.answer(inputs(batch), candidates=CANDIDATES)
    generated = model.generate(inputs(batch), eos_token_id=-1, max_new_tokens=4)
    attention = model.image_attention(inputs(batch))
    for b in range(batch.input_ids.shape[0]):
        single = row(batch, b)
        n = single.input_ids.shape[1]
        torch.testing.assert_close(model(single).logits[0], logits[b, :n], atol=1e-5, rtol=0)
        torch.testing.assert_close(model.answer(inputs(single), candidates=CANDIDATES)[0], probs[b],
                                   atol=1e-5, rtol=0)
        assert torch.equal(model.generate(inputs(single), eos_token_id=-1, max_new_tokens=4)[0], generated[b])
        torch.testing.assert_close(model.image_attention(inputs(single))[0], attention[b], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- answering


@pytest.mark.parametrize("pack_questions", [False, True])  # True: answer()'s mask against the packed forward
def test_answer_equals_scoring_each_candidate_with_a_full_forward(config, make_batch, pack_questions):
    model = build(config, pack_questions=pack_questions)
    batch = make_batch(model.config)
    probs = model.answer(inputs(batch), candidates=CANDIDATES)
    assert probs.shape == (5, len(CANDIDATES))
    for b in range(5):
        prefix = batch.input_ids[b, : int(batch.prefix_lengths[b])].tolist()
        scores = []
        for candidate in CANDIDATES:
            ids = torch.tensor([prefix + candidate])
            logits = model(Batch(batch.images, batch.image_index[b:b + 1], ids, torch.ones_like(ids),
                                 batch.prefix_lengths[b:b + 1])).logits[0]
            log_probs = logits[len(prefix) - 1:-1].log_softmax(-1)
            scores.append(log_probs.gather(-1, torch.tensor(candidate)[:, None]).sum())
        torch.testing.assert_close(probs[b], torch.stack(scores).softmax(-1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("pack_questions", [False, True])
def test_generate_with_cache_equals_without(config, make_batch, pack_questions):
    model = build(config, pack_questions=pack_questions)
    batch = make_batch(model.config)
    cached = model.generate(inputs(batch), eos_token_id=-1, max_new_tokens=5)
    uncached = model.generate(inputs(batch), eos_token_id=-1, max_new_tokens=5, use_cache=False)
    assert cached.shape == (5, 5) and torch.equal(cached, uncached)
    # the first generated token is the argmax of the forward logits at [SEP]
    sep_logits = model(batch).logits[torch.arange(5), batch.prefix_lengths - 1]
    assert torch.equal(cached[:, 0], sep_logits.argmax(-1))


def test_image_attention_maps(config, make_batch):
    model = build(config)
    batch = make_batch(model.config)
    maps = model.image_attention(inputs(batch))
    assert maps.shape == (5, 2, 4, 16)  # [B, layers, heads, image tokens]
    assert (maps >= 0).all() and (maps.sum(-1) <= 1 + 1e-5).all() and (maps.sum(-1) > 0).all()
    with pytest.raises(ValueError, match="blind"):
        build(config, vision="none").image_attention(inputs(batch))


def test_blind_variant_has_no_image_tokens(config, make_batch):
    model = build(config, vision="none")
    batch = make_batch(model.config)
    assert not any(k.startswith(("vision_tower", "multi_modal_projector")) for k in model.state_dict())
    out = model(replace(batch, images=None, image_index=None))
    assert out.logits.shape == (*batch.input_ids.shape, VOCAB_SIZE) and torch.isfinite(out.losses["answer"])
    with_images = model(batch)
    torch.testing.assert_close(with_images.logits, out.logits)
    assert model.answer(inputs(batch), candidates=CANDIDATES).shape == (5, len(CANDIDATES))


# ---------------------------------------------------------------- mixed precision


def test_bf16_autocast_on_cpu(config, make_batch):
    model = build(config, connector="qformer").train()
    batch = make_batch(model.config)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
    assert torch.isfinite(out.losses["answer"])
    out.losses["answer"].backward()
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        probs = model.answer(inputs(batch), candidates=CANDIDATES)
        generated = model.generate(inputs(batch), eos_token_id=EOS, max_new_tokens=3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5))
    assert generated.shape[0] == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_autocast_on_cuda(config, make_batch):
    model = build(config).cuda().train()
    batch = make_batch(model.config).to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)  # as vlm.train.make_optimizer builds it
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(batch, answer_only=True)  # the training forward
    out.losses["answer"].backward()
    optimizer.step()
    assert torch.isfinite(out.losses["answer"])
    model.eval()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        cached = model.generate(inputs(batch), eos_token_id=-1, max_new_tokens=4)
        probs = model.answer(inputs(batch), candidates=CANDIDATES)
    assert cached.shape == (5, 4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5, device="cuda"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_packed_training_pass_on_cuda_waits_for_the_gpu_before_the_image_tokens_only(config, make_batch):
    """CUDA's own check of the reads counted above: from the image tokens on, the bf16 forward and the backward pass
    never wait for the GPU (a synchronising call raises)."""
    model = build(config, pack_questions=True).cuda().train()
    batch = make_batch(model.config, batch=7, num_images=3).to("cuda")
    encode_images = model.encode_images

    def encode_images_strictly(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        return encode_images(*args, **kwargs)

    model.encode_images = encode_images_strictly
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch, answer_only=True).losses["answer"]
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss)


def compiled_against_eager(config, make_batch, device: str, pack: bool) -> None:
    """runtime.train.compile: the compiled layers give the eager model's losses and gradients under bf16
    autocast on ``device``, for the per-question rows or the packed ones."""
    eager = build(config, pack_questions=pack).to(device).train()
    compiled = build(config, pack_questions=pack).to(device).train()
    compiled.load_state_dict(eager.state_dict())
    compile_layers(compiled)
    for seed in range(3):  # other lengths each time: dynamic shapes
        batch = make_batch(eager.config, batch=5 + seed, seed=seed).to(device)
        losses = []
        for model in (eager, compiled):
            model.zero_grad()
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = model(batch, answer_only=True).losses["answer"]
            loss.backward()
            losses.append(loss.float())
        torch.testing.assert_close(losses[0], losses[1], rtol=2e-2, atol=2e-2)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=5e-2, atol=5e-3, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pack", [False, True])
def test_compiled_layers_train_as_eager_on_cuda(config, make_batch, pack):
    compiled_against_eager(config, make_batch, "cuda", pack)


@pytest.mark.skipif(not (shutil.which("c++") or shutil.which("g++")), reason="needs a C++ compiler (inductor)")
def test_compiled_packed_layers_train_as_eager_on_the_cpu(config, make_batch):
    """The same on the CPU, where the compiled layers are inductor's C++ (the option works without a GPU), for the
    GPU recipe's packed rows."""
    compiled_against_eager(config, make_batch, "cpu", pack=True)


# ---------------------------------------------------------------- HuggingFace PaliGemma


def hf_paligemma(transformers, cfg: PaliGemmaConfig):
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


def hf_logits(hf, ours: PaliGemma, batch) -> torch.Tensor:
    """transformers PaliGemma's logits at the text positions of ``batch``, in its prefix-LM mode."""
    tokens, (batch_size, length) = ours.num_image_tokens, batch.input_ids.shape
    mean = torch.tensor(ours.config.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(ours.config.image_std).view(1, 3, 1, 1)
    pixel_values = (batch.images[batch.image_index].float() / 255 - mean) / std
    image_ids = torch.full((batch_size, tokens), ours.config.gemma.vocab_size)
    positions = torch.arange(length)
    answer_part = (positions >= batch.prefix_lengths[:, None]).long()  # token_type_ids: 0 prefix, 1 suffix
    with torch.no_grad():
        return hf(input_ids=torch.cat([image_ids, batch.input_ids], 1), pixel_values=pixel_values,
                  attention_mask=torch.cat([torch.ones(batch_size, tokens, dtype=torch.long), batch.attention_mask], 1),
                  token_type_ids=torch.cat([torch.zeros(batch_size, tokens, dtype=torch.long), answer_part], 1),
                  position_ids=torch.arange(tokens + length).expand(batch_size, -1)).logits[:, tokens:]


def assert_same_logits(hf, ours: PaliGemma, batch) -> None:
    expected = hf_logits(hf, ours, batch)
    with torch.no_grad():
        got = ours(batch).logits
    valid = batch.attention_mask.bool()
    assert expected[valid].std() > 0.1  # logits that differ across tokens, not a degenerate comparison
    torch.testing.assert_close(got[valid], expected[valid], atol=1e-4, rtol=0)


def test_loads_hf_paligemma(transformers, config, make_batch, tmp_path):
    """Same weights, same logits: the saved HF PaliGemma file loads into the core (all but the tied LM head,
    which HF stores once as the embeddings), and the prefix-LM outputs agree."""
    from safetensors.torch import load_file

    ours = build(config)
    hf = hf_paligemma(transformers, ours.config)
    hf.save_pretrained(tmp_path)
    missing, unexpected = ours.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=False)
    assert missing == ["language_model.lm_head.weight"] and unexpected == []
    assert torch.equal(ours.language_model.lm_head.weight, hf.lm_head.weight)
    assert_same_logits(hf, ours, make_batch(ours.config))


def test_saves_to_hf_paligemma(transformers, config, make_batch, perturb, tmp_path):
    """The core's state dict, written as a safetensors file beside a PaliGemma config.json, is a checkpoint
    transformers loads with no missing or unexpected weight (the tied LM head aside), with the same logits."""
    from safetensors.torch import save_file

    ours = build(config)
    perturb(ours)
    hf_paligemma(transformers, ours.config).config.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in ours.state_dict().items() if k != "language_model.lm_head.weight"}
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    hf, info = transformers.PaliGemmaForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert_same_logits(hf.eval(), ours, make_batch(ours.config))


def test_pixel_shuffle_merges_neighbouring_patches():
    from vlm.models.connector import pixel_shuffle

    grid = torch.arange(16, dtype=torch.float32).view(1, 16, 1)  # patch t has feature t, 4 x 4 grid
    merged = pixel_shuffle(grid, 2, (4, 4))  # [1, 4, 4]
    assert merged.shape == (1, 4, 4)
    assert merged[0, 0].tolist() == [0, 1, 4, 5]  # the top-left 2 x 2 block
    assert merged[0, 3].tolist() == [10, 11, 14, 15]  # the bottom-right block
    config = PaliGemmaConfig.from_params({"pixel_shuffle": 2, "siglip": {"patch_size": 16}}, 57, 128)
    assert config.num_image_tokens == 16
    model = PaliGemma(config)
    tokens, losses = model.encode_images(torch.randint(0, 255, (3, 3, 128, 128), dtype=torch.uint8))
    assert losses == {} and tokens.shape == (3, 16, config.gemma.hidden_size)
    with pytest.raises(ParamError, match="model.pixel_shuffle: must be >= 1 and divide the patch grid"):
        PaliGemmaConfig.from_params({"pixel_shuffle": 3, "siglip": {"patch_size": 16}}, 57, 128)
    # the Q-Former reads every patch: a shuffle that does not divide the grid is no error there, one below 1 is
    qformer = PaliGemmaConfig.from_params({"connector": "qformer", "pixel_shuffle": 3, "siglip": {"patch_size": 16},
                                           "qformer": {"num_query_tokens": 8}}, 57, 128)
    assert qformer.num_image_tokens == 8
    with pytest.raises(ParamError, match="model.pixel_shuffle: must be >= 1, got 0"):
        PaliGemmaConfig.from_params({"connector": "qformer", "pixel_shuffle": 0}, 57, 128)


def test_pixel_shuffle_on_a_rectangular_grid_merges_row_major_blocks():
    from vlm.models.connector import pixel_shuffle

    grid = torch.arange(24, dtype=torch.float32).view(1, 24, 1)  # 4 rows x 6 columns, patch t has feature t
    merged = pixel_shuffle(grid, 2, (4, 6))  # [1, 2 * 3, 4]
    assert merged.shape == (1, 6, 4)
    assert merged[0, 0].tolist() == [0, 1, 6, 7] and merged[0, 2].tolist() == [4, 5, 10, 11]
    assert merged[0, 5].tolist() == [16, 17, 22, 23]
    config = PaliGemmaConfig.from_params({"pixel_shuffle": 2, "siglip": {"patch_size": 16}}, 57, 128,
                                         image_width=224)  # 8 x 14 patches -> 4 x 7 tokens
    assert (config.siglip.grid, config.num_image_tokens) == ((8, 14), 28)
    tokens, _ = PaliGemma(config).encode_images(torch.randint(0, 255, (2, 3, 128, 224), dtype=torch.uint8))
    assert tokens.shape == (2, 28, config.gemma.hidden_size)
    with pytest.raises(ValueError, match=r"images must be uint8 \[N, 3, 128, 224\]"):
        PaliGemma(config).encode_images(torch.zeros(1, 3, 128, 128, dtype=torch.uint8))
    with pytest.raises(ParamError, match=r"divide the patch grid \(8 x 10 patches"):
        PaliGemmaConfig.from_params({"pixel_shuffle": 4, "siglip": {"patch_size": 16}}, 57, 128, image_width=160)
