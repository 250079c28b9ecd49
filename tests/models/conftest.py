"""Tiny model configs and Batch-contract batches shared by the model tests."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vlm.batch import Batch
from vlm.models.gemma import GemmaConfig
from vlm.models.paligemma import PaliGemmaConfig
from vlm.models.qformer import QFormerConfig
from vlm.models.siglip import SiglipVisionConfig

VOCAB_SIZE = 40
SOS, EOS, YES, NO, SEP = 2, 3, 4, 5, 7


@pytest.fixture
def transformers():
    """transformers is a test-only extra (installed by `make test`); without it HF parity tests skip."""
    return pytest.importorskip("transformers", reason="transformers (test extra) is needed for HF parity tests")


def tiny_config(**overrides) -> PaliGemmaConfig:
    config = PaliGemmaConfig(
        siglip=SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  image_size=32, patch_size=8),
        gemma=GemmaConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2),
        qformer=QFormerConfig(num_query_tokens=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=32, cross_attention_freq=2),
        image_mean=[0.4, 0.45, 0.5], image_std=[0.2, 0.25, 0.3])
    return dataclasses.replace(config, **overrides)


@pytest.fixture
def config():
    return tiny_config


def random_batch(config: PaliGemmaConfig, batch: int = 5, num_images: int = 3, seed: int = 0) -> Batch:
    """A right-padded batch as the collate function builds it: [SOS] question [SEP] answer [EOS],
    questions and answers of different lengths, several questions per image."""
    g = torch.Generator().manual_seed(seed)
    size = config.siglip.image_size
    images = torch.randint(0, 256, (num_images, 3, size, size), dtype=torch.uint8, generator=g)
    sequences, prefix_lengths, answer_spans = [], [], []
    for b in range(batch):
        question = [SOS] + torch.randint(10, VOCAB_SIZE, (2 + b % 4,), generator=g).tolist() + [SEP]
        answer = [[YES], [NO], torch.randint(10, VOCAB_SIZE, (1 + b % 2,), generator=g).tolist()][b % 3] + [EOS]
        sequences.append(question + answer)
        prefix_lengths.append(len(question))
        answer_spans.append((len(question), len(question) + len(answer)))
    length = max(map(len, sequences))
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    attention_mask = torch.zeros(batch, length, dtype=torch.long)
    labels = torch.full((batch, length), -100)
    for b, ids in enumerate(sequences):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention_mask[b, : len(ids)] = 1
        start, end = answer_spans[b]
        labels[b, start:end] = input_ids[b, start:end]
    return Batch(images=images, image_index=torch.arange(batch) % num_images, input_ids=input_ids,
                 attention_mask=attention_mask, prefix_lengths=torch.tensor(prefix_lengths), labels=labels)


@pytest.fixture
def make_batch():
    return random_batch


def select_row(batch: Batch, b: int) -> Batch:
    """Row ``b`` of a batch on its own, without padding and with only its image."""
    length = int(batch.attention_mask[b].sum())
    return Batch(images=batch.images[batch.image_index[b]][None], image_index=torch.zeros(1, dtype=torch.long),
                 input_ids=batch.input_ids[b:b + 1, :length], attention_mask=batch.attention_mask[b:b + 1, :length],
                 prefix_lengths=batch.prefix_lengths[b:b + 1], labels=batch.labels[b:b + 1, :length])


@pytest.fixture
def row():
    return select_row


def perturb_(module: torch.nn.Module, std: float = 0.05, seed: int = 0) -> None:
    """Add noise to every parameter, so zero biases and unit/zero norm weights are exercised too."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)


@pytest.fixture
def perturb():
    return perturb_


@pytest.fixture(autouse=True)
def one_thread():
    """The models here are tiny: intra-op threads only add synchronisation (and the cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
