"""The PaliGemma core: SigLIP -> connector -> Gemma, prefix-LM, and nothing else (the sequence layout, the merge, the
parameter names and the blind baseline, ``vision: none``: docs/architecture.md, the model). A task adds to the core
only through a :class:`vlm.models.extension.VisionExtension` (parameters under ``extension.*``)."""

from __future__ import annotations

import dataclasses
import operator
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from vlm.batch import IGNORE_INDEX, Batch
from vlm.config import build_config, check
from vlm.models.connector import LinearConnector
from vlm.models.extension import VisionExtension
from vlm.models.gemma import (
    GemmaConfig,
    GemmaForCausalLM,
    gemma_config_from_pretrained,
    load_pretrained_gemma,
    prefix_lm_mask,
)
from vlm.models.image_size import PIXEL_SHUFFLE, check_image_size
from vlm.models.packing import PackedRows
from vlm.models.pretrained import pretrained_config, read_config
from vlm.models.qformer import QFormerConfig, QFormerConnector
from vlm.models.siglip import (
    SiglipVisionConfig,
    SiglipVisionModel,
    load_pretrained_siglip,
    siglip_config_from_pretrained,
)

_FROM_DATA = {  # fields of the model config that come from the data, never from params.yaml
    ("gemma", "vocab_size"): "the vocabulary size (data/processed/vocab.json)",
    ("siglip", "image_size"): "the packed image size (data/processed/*_images.h5)",
    ("siglip", "image_width"): "the packed image size (data/processed/*_images.h5)",
    ("siglip", "num_channels"): "the packed images, which are RGB (3 channels)",
    ("image_mean",): "the train split statistics (data/processed/train_images.h5)",
    ("image_std",): "the train split statistics (data/processed/train_images.h5)",
}


@dataclass
class PaliGemmaConfig:
    # validate() checks siglip only with vision: the blind baseline's is unused, and the patch size it keeps need not
    # divide the data's image size (a patch-14 VLM's 392-wide frames: 392 % 16)
    validates_nested: ClassVar[tuple[str, ...]] = ("siglip",)
    vision: Literal["siglip", "none"] = "siglip"
    connector: Literal["linear", "qformer"] = "linear"
    pixel_shuffle: int = PIXEL_SHUFFLE  # linear connector: r x r neighbouring patches -> one image token (1: PaliGemma)
    pack_questions: bool = False  # one decoder row per image (vlm.models.packing; departure 8). False = PaliGemma
    vision_checkpoint: str | None = None  # a saved HF SigLIP (or PaliGemma) folder: the encoder starts from it
    decoder_checkpoint: str | None = None  # a saved HF GemmaForCausalLM (or PaliGemma) folder: the decoder too
    siglip: SiglipVisionConfig = field(default_factory=SiglipVisionConfig)
    gemma: GemmaConfig = field(default_factory=GemmaConfig)
    qformer: QFormerConfig = field(default_factory=QFormerConfig)
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])  # 0..1 scale, per RGB channel
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])

    @property
    def num_image_tokens(self) -> int:
        if self.vision == "none":
            return 0
        if self.connector == "qformer":
            return self.qformer.num_query_tokens
        return self.siglip.num_patches // (self.pixel_shuffle * self.pixel_shuffle)

    def validate(self, prefix: str = "model") -> None:
        check(self.vision in ("siglip", "none"), f"{prefix}.vision", f"must be 'siglip' or 'none', got {self.vision!r}")
        check(self.connector in ("linear", "qformer"), f"{prefix}.connector",
              f"must be 'linear' or 'qformer', got {self.connector!r}")
        check(self.pixel_shuffle >= 1, f"{prefix}.pixel_shuffle", f"must be >= 1, got {self.pixel_shuffle}")
        if self.vision == "siglip":
            self.siglip.validate(f"{prefix}.siglip")
            rows, columns = self.siglip.grid
            # only the linear connector shuffles; the Q-Former's queries read every patch
            check(self.connector != "linear" or (rows % self.pixel_shuffle == 0 and columns % self.pixel_shuffle == 0),
                  f"{prefix}.pixel_shuffle", f"must be >= 1 and divide the patch grid ({rows} x {columns} patches, "
                  f"rows x columns), got {self.pixel_shuffle}")
        self.gemma.validate(f"{prefix}.gemma")
        self.qformer.validate(f"{prefix}.qformer")
        for name in ("image_mean", "image_std"):
            values = getattr(self, name)
            check(len(values) == 3, f"{prefix}.{name}", f"must hold 3 values (R, G, B), got {len(values)}")
        check(all(s > 0 for s in self.image_std), f"{prefix}.image_std", f"must be positive, got {self.image_std}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], what: str = "model") -> PaliGemmaConfig:
        """Rebuild a config saved with :meth:`to_dict` (e.g. from a checkpoint), validating it."""
        return build_config(cls, values, what)

    @classmethod
    def from_params(cls, model_section: Mapping[str, Any], vocab_size: int, image_size: int,
                    image_mean: list[float] | None = None, image_std: list[float] | None = None,
                    image_width: int | None = None) -> PaliGemmaConfig:
        """Build and validate the config (of this class or a subclass) from params.yaml's ``model:`` plus what the
        data fixes (vocabulary, image height and width (None: square), train-split mean/std), before any weight."""
        vocab_size, image_size = operator.index(vocab_size), operator.index(image_size)
        image_width = image_size if image_width is None else operator.index(image_width)
        values = dict(model_section or {})
        hints = typing.get_type_hints(cls)
        for sub in (f.name for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])):
            check(isinstance(values.get(sub, {}), Mapping), f"model.{sub}", "must be a mapping")
            values[sub] = dict(values.get(sub, {}))
        for path, source in _FROM_DATA.items():
            where = values[path[0]] if len(path) == 2 else values
            check(path[-1] not in where, f"model.{'.'.join(path)}", f"set from {source}, not in params.yaml")

        checkpoint = values.get("vision_checkpoint")
        if checkpoint is not None and values.get("vision", "siglip") == "siglip":
            # the encoder's sizes and pixel normalisation are the checkpoint's: model.siglip is not used
            pretrained_siglip = pretrained_config("vision_checkpoint", checkpoint, siglip_config_from_pretrained)
            values["siglip"] = {k: v for k, v in dataclasses.asdict(pretrained_siglip).items()
                                 if k not in ("image_size", "image_width")}
            # its preprocessor_config.json's pixel mean/std (without one SigLIP's 0.5, below)
            _, preprocessor = read_config(Path(checkpoint), "preprocessor_config.json") or (None, {})
            image_mean, image_std = preprocessor.get("image_mean"), preprocessor.get("image_std")
        decoder = values.get("decoder_checkpoint")
        if decoder is not None:  # the decoder's sizes are the checkpoint's: model.gemma is not used
            pretrained_gemma = pretrained_config("decoder_checkpoint", decoder, gemma_config_from_pretrained)
            values["gemma"] = {k: v for k, v in dataclasses.asdict(pretrained_gemma).items() if k != "vocab_size"}
        check_image_size(values, (image_size, image_width), "the image size of the data")
        values["siglip"]["image_size"] = image_size
        values["siglip"]["image_width"] = None if image_width == image_size else image_width  # None: square
        values["gemma"]["vocab_size"] = vocab_size
        # numpy scalars (HDF5 attributes and metadata) become plain Python numbers
        values["image_mean"] = [float(v) for v in (image_mean if image_mean is not None else (0.5, 0.5, 0.5))]
        values["image_std"] = [float(v) for v in (image_std if image_std is not None else (0.5, 0.5, 0.5))]
        return build_config(cls, values, "model")


@dataclass
class VLMOutput:
    logits: torch.Tensor  # [B, L, V] at the text positions; [B, A, V] at the answer's with answer_only
    # with batch.labels: "answer" (the mean cross-entropy over the answer tokens); with batch.targets, the extension's
    losses: dict[str, torch.Tensor] = field(default_factory=dict)


class PaliGemma(nn.Module):
    def __init__(self, config: PaliGemmaConfig, extension: VisionExtension | None = None):
        super().__init__()
        config.validate()
        if extension is not None and config.vision != "siglip":
            raise ValueError("a vision extension needs the vision encoder (model.vision: siglip)")
        self.config = config
        if config.vision == "siglip":
            self.vision_tower = SiglipVisionModel(config.siglip)
            # the connector reads the patch features, and beside them the extension's per-patch features
            connector_in = config.siglip.hidden_size + (extension.patch_width if extension is not None else 0)
            if config.connector == "linear":
                self.multi_modal_projector = LinearConnector(connector_in, config.gemma.hidden_size,
                                                             config.siglip.grid, config.pixel_shuffle)
            else:
                self.multi_modal_projector = QFormerConnector(config.qformer, connector_in, config.gemma.hidden_size)
        self.language_model = GemmaForCausalLM(config.gemma)
        self.extension = extension
        mean = torch.tensor(config.image_mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(config.image_std, dtype=torch.float32).view(1, 3, 1, 1)
        # uint8 -> normalised float in one multiply-add: (x / 255 - mean) / std
        self.register_buffer("pixel_scale", 1.0 / (255.0 * std), persistent=False)
        self.register_buffer("pixel_shift", -mean / std, persistent=False)

    @property
    def num_image_tokens(self) -> int:
        return self.config.num_image_tokens + (self.extension.num_tokens if self.extension is not None else 0)

    @property
    def loss_weights(self) -> dict[str, float]:
        """The weight of each loss :meth:`forward` returns, in training's weighted sum."""
        return {"answer": 1.0, **(self.extension.loss_weights if self.extension is not None else {})}

    def encode_images(self, images: torch.Tensor, targets: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """uint8 images ``[N, 3, H, W]`` -> image tokens ``[N, T, D]``, and the extension's losses given ``targets``."""
        expected = (3, *self.config.siglip.height_width)
        if images.dtype != torch.uint8 or images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(f"images must be uint8 [N, {', '.join(map(str, expected))}], "
                             f"got {images.dtype} {list(images.shape)}")
        pixel_values = torch.addcmul(self.pixel_shift, images.float(), self.pixel_scale)  # [N, 3, H, W]
        if self.extension is None:
            features = self.vision_tower(pixel_values).last_hidden_state  # [N, P, Dv]
            return self.multi_modal_projector(features), {}
        residual, state = self.extension.adapt(pixel_values)
        features = self.vision_tower(pixel_values, patch_residual=residual).last_hidden_state  # [N, P, Dv]
        extra = self.extension(features, state, targets)
        tokens = self.multi_modal_projector(torch.cat([features, extra.patch_features], dim=-1))  # [N, T', D]
        return torch.cat([tokens, extra.tokens], dim=1), extra.losses

    @property
    def isolated_image_tokens(self) -> int:
        """Leading image slots that attend to each other only: all with ``pack_questions``, else none (PaliGemma)."""
        return self.num_image_tokens if self.config.pack_questions else 0

    def _embed(self, batch: Batch, prefix_only: bool):
        """Image tokens (each distinct image encoded once, gathered per question), then the text: ``inputs_embeds``
        ``[B, T + L, D]``, ``key_valid`` ``[B, T + L]`` (False on padding, and past the prefix when ``prefix_only``),
        ``prefix_total`` ``[B]`` = T + prefix length and, given ``batch.targets``, the extension's losses."""
        text_embeds = self.language_model.model.embed_tokens(batch.input_ids)  # [B, L, D]
        text_valid = batch.attention_mask.bool()  # [B, L]
        if prefix_only:
            positions = torch.arange(batch.input_ids.shape[1], device=batch.input_ids.device)
            text_valid = text_valid & (positions < batch.prefix_lengths[:, None])
        if self.config.vision == "none":
            return text_embeds, text_valid, batch.prefix_lengths, {}
        # the extension's targets: for its losses, and before answering only for an extension that reads them
        reads_targets = not prefix_only or (self.extension is not None and self.extension.reads_targets)
        image_tokens, losses = self.encode_images(batch.images, batch.targets if reads_targets else None)
        image_tokens = image_tokens[batch.image_index].to(text_embeds.dtype)  # [B, T, D]
        image_valid = text_valid.new_ones(image_tokens.shape[:2])
        return (torch.cat([image_tokens, text_embeds], dim=1), torch.cat([image_valid, text_valid], dim=1),
                batch.prefix_lengths + image_tokens.shape[1], losses)

    def forward(self, batch: Batch, answer_only: bool = False) -> VLMOutput:
        """Logits ``[B, L, V]`` for the text positions and, with ``batch.labels``, the losses (the answer's; with
        ``batch.targets`` the extension's too). ``answer_only`` (training): the last decoder layer and the LM head
        compute only the A positions predicting answer tokens (column a of row b: text position
        ``prefix_lengths[b] + a``): logits ``[B, A, V]``, the same loss. ``pack_questions``: a row per image."""
        length = batch.input_ids.shape[1]
        if answer_only:
            if batch.labels is None:
                raise ValueError("forward(answer_only=True) needs batch.labels: the answer is where they are")
            offsets = torch.arange(answer_length(batch), device=batch.input_ids.device)  # [A]
            text_positions = batch.prefix_lengths[:, None] + offsets  # [B, A] the tokens they predict
            labels = batch.labels.gather(1, text_positions.clamp(max=length - 1))
            labels = labels.masked_fill(text_positions >= length, IGNORE_INDEX)  # [B, A]
            outputs = (text_positions - 1).clamp(max=length - 1)  # [B, A] the positions predicting them
        else:
            outputs = torch.arange(length, device=batch.input_ids.device).expand(len(batch), length)  # [B, L]
            # position t predicts token t + 1; the last position predicts nothing
            labels = None if batch.labels is None else F.pad(batch.labels[:, 1:], (0, 1), value=IGNORE_INDEX)
        decode = self._decode_packed if self.config.pack_questions else self._decode
        hidden, losses = decode(batch, outputs)  # [B, Q, D]
        logits = self.language_model.lm_head(hidden)  # [B, Q, V]
        if labels is not None:
            losses = {"answer": F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                                ignore_index=IGNORE_INDEX), **losses}
        return VLMOutput(logits=logits, losses=losses)

    def _decode(self, batch: Batch, outputs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One decoder row per question ``[image tokens | text]``: the hidden states ``[B, Q, D]`` at ``outputs``."""
        inputs_embeds, key_valid, prefix_total, losses = self._embed(batch, prefix_only=False)
        num, length, _ = inputs_embeds.shape
        slots = torch.arange(length, device=inputs_embeds.device).expand(num, length)  # [B, S]
        mask = prefix_lm_mask(key_valid, slots, prefix_total, self.isolated_image_tokens)
        output_slots = outputs + (length - batch.input_ids.shape[1])  # [B, Q] after the T image tokens
        hidden, _ = self.language_model.model(inputs_embeds, slots, mask, output_slots=output_slots)
        return hidden, losses

    def _decode_packed(self, batch: Batch, outputs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`_decode` with one decoder row per image, ``[image tokens | q1 a1 | q2 a2 | ...]``."""
        text_embeds = self.language_model.model.embed_tokens(batch.input_ids)  # [B, L, D]
        blind = self.config.vision == "none"  # no image tokens: a row per image all the same, or per question
        if blind:
            image_index = batch.image_index if batch.image_index is not None else torch.arange(
                len(batch), device=text_embeds.device)
            num_rows = int(image_index.max()) + 1
        else:
            image_index, num_rows = batch.image_index, batch.images.shape[0]
        # before the image tokens: on a GPU, the sizes it reads back then wait for the batch's copy alone
        rows = PackedRows.build(image_index, num_rows, self.num_image_tokens, batch.attention_mask,
                                batch.prefix_lengths)
        image_tokens, losses = (text_embeds.new_zeros(num_rows, 0, text_embeds.shape[2]), {}) if blind \
            else self.encode_images(batch.images, batch.targets)  # [N, T, D]
        inputs_embeds = rows.pack(image_tokens, text_embeds)  # [N, S, D]
        output_slots = rows.row_slots(rows.slots.gather(1, outputs))  # [N, K*Q]
        hidden, _ = self.language_model.model(inputs_embeds, rows.position_ids, rows.mask,
                                              output_slots=output_slots)  # [N, K*Q, D]
        return rows.unpack(hidden, outputs.shape[1]), losses

    @torch.no_grad()
    def generate(self, batch: Batch, *, eos_token_id: int, max_new_tokens: int = 8, pad_token_id: int = 0,
                 use_cache: bool = True) -> torch.Tensor:
        """Greedy answers ``[B, T]`` after each prefix, with the KV cache; a row ends at its first [EOS], then pads."""
        inputs_embeds, key_valid, prefix_total, _ = self._embed(batch, prefix_only=True)
        return self.language_model.generate(inputs_embeds, key_valid, prefix_total, max_new_tokens, eos_token_id,
                                            pad_token_id, prefix_lm=True, use_cache=use_cache,
                                            isolated=self.isolated_image_tokens)

    @torch.no_grad()
    def answer(self, batch: Batch, candidates: list[list[int]]) -> torch.Tensor:
        """Constrained decoding (docs/architecture.md): probabilities ``[B, C]`` over the token-id lists of answers."""
        if not candidates or any(len(c) == 0 for c in candidates):
            raise ValueError("answer(): candidates must be a non-empty list of non-empty token-id lists")
        inputs_embeds, key_valid, prefix_total, _ = self._embed(batch, prefix_only=True)
        num, prefix_length, dim = inputs_embeds.shape
        device = inputs_embeds.device
        num_candidates, cand_length = len(candidates), max(len(c) for c in candidates)
        lengths = torch.tensor([len(c) for c in candidates], device=device)  # [C]
        cand_ids = nn.utils.rnn.pad_sequence([torch.tensor(c) for c in candidates], batch_first=True).to(device)
        cand_valid = torch.arange(cand_length, device=device) < lengths[:, None]  # [C, T], as cand_ids

        cand_embeds = self.language_model.model.embed_tokens(cand_ids).view(1, -1, dim)  # [1, C*T, D]
        inputs_embeds = torch.cat([inputs_embeds, cand_embeds.expand(num, -1, -1).to(inputs_embeds.dtype)], 1)
        offsets = torch.arange(cand_length, device=device).repeat(num_candidates)  # [C*T]
        prefix_slots = torch.arange(prefix_length, device=device).expand(num, -1)  # [B, S]
        position_ids = torch.cat([prefix_slots, prefix_total[:, None] + offsets], dim=1)  # [B, S + C*T]

        mask = packed_candidates_mask(key_valid, prefix_total, cand_valid,
                                      self.isolated_image_tokens)  # [B, 1, S + C*T, S + C*T]
        hidden, _ = self.language_model.model(inputs_embeds, position_ids, mask)  # [B, S + C*T, D]
        lm_head = self.language_model.lm_head
        rows = torch.arange(num, device=device)
        first = lm_head(hidden[rows, prefix_total - 1]).float().log_softmax(-1)  # [B, V]
        log_likelihood = first[:, cand_ids[:, 0]]  # [B, C]
        if cand_length > 1:
            cand_hidden = hidden[:, prefix_length:].view(num, num_candidates, cand_length, dim)[:, :, :-1]
            later = lm_head(cand_hidden).float().log_softmax(-1)  # [B, C, T-1, V]
            targets = cand_ids[:, 1:].expand(num, -1, -1)[..., None]  # [B, C, T-1, 1]
            later = later.gather(-1, targets)[..., 0] * cand_valid[:, 1:]  # [B, C, T-1]
            log_likelihood = log_likelihood + later.sum(-1)
        return log_likelihood.softmax(-1)

    @torch.no_grad()
    def image_attention(self, batch: Batch) -> torch.Tensor:
        """Attention probabilities ``[B, num_layers, num_heads, T]`` from the position predicting the first answer
        token ([SEP]) to the T image tokens (explicit attention path), for heat maps: with the linear connector token
        t is cell t of the row-major (pixel-shuffled) patch grid, with the Q-Former query t; an extension's are last."""
        if self.config.vision == "none":
            raise ValueError("image_attention(): the blind model (vision: none) has no image tokens")
        inputs_embeds, key_valid, prefix_total, _ = self._embed(batch, prefix_only=True)
        num, length, _ = inputs_embeds.shape
        slots = torch.arange(length, device=inputs_embeds.device).expand(num, length)
        mask = prefix_lm_mask(key_valid, slots, prefix_total, self.isolated_image_tokens)
        _, attentions = self.language_model.model(inputs_embeds, slots, mask, output_attentions=True)
        rows = torch.arange(num, device=inputs_embeds.device)
        return torch.stack([layer[rows, :, prefix_total - 1, :self.num_image_tokens] for layer in attentions], dim=1)


def answer_length(batch: Batch) -> int:
    """A: the most answer tokens of a row (the labelled positions, which must start at ``prefix_lengths``)."""
    positions = torch.arange(batch.labels.shape[1], device=batch.labels.device)  # [L]
    labelled = batch.labels != IGNORE_INDEX  # [B, L]
    ends = torch.where(labelled, positions + 1 - batch.prefix_lengths[:, None], 0).amax(1)  # [B]
    in_prefix = (labelled & (positions < batch.prefix_lengths[:, None])).any()
    length, bad = torch.stack([ends.max(), in_prefix.long()]).tolist()  # one host sync
    if bad:
        raise ValueError("batch.labels: a labelled token inside the prefix (before prefix_lengths); "
                         "answer_only computes the answer positions only")
    return max(length, 1)


def packed_candidates_mask(key_valid: torch.Tensor, prefix_total: torch.Tensor, cand_valid: torch.Tensor,
                           isolated: int = 0) -> torch.Tensor:
    """Attention mask ``[B, 1, S + C*T, S + C*T]``: a prefix (``key_valid`` ``[B, S]``, prefix-LM over
    ``prefix_total``), then C candidates of T tokens (``cand_valid`` ``[C, T]``) it never sees, each seeing it and its
    own earlier tokens as if alone after it; the first ``isolated`` slots see each other only."""
    batch, prefix_length = key_valid.shape
    num_candidates, cand_length = cand_valid.shape
    packed = num_candidates * cand_length
    device = key_valid.device
    prefix_slots = torch.arange(prefix_length, device=device).expand(batch, -1)
    prefix_rows = prefix_lm_mask(key_valid, prefix_slots, prefix_total, isolated)  # [B, 1, S, S]
    prefix_rows = torch.cat([prefix_rows, prefix_rows.new_zeros(batch, 1, prefix_length, packed)], dim=3)
    candidate = torch.arange(num_candidates, device=device).repeat_interleave(cand_length)  # [C*T]
    offset = torch.arange(cand_length, device=device).repeat(num_candidates)  # [C*T]
    own_earlier = (candidate[:, None] == candidate[None, :]) & (offset[None, :] <= offset[:, None])
    own_earlier = own_earlier & cand_valid.view(1, -1)  # [C*T, C*T]
    cand_rows = torch.cat([key_valid[:, None, :].expand(-1, packed, -1), own_earlier.expand(batch, -1, -1)],
                          dim=2)[:, None]  # [B, 1, C*T, S + C*T]
    return torch.cat([prefix_rows, cand_rows], dim=2)


def load_pretrained(model: PaliGemma) -> PaliGemma:
    """A freshly built model to train, given the pretrained encoder (``vision_checkpoint``, positions resampled) and
    decoder (``decoder_checkpoint``, token embeddings fresh unless its vocabulary is the tokenizer's) where set."""
    config = model.config
    if config.vision == "siglip" and config.vision_checkpoint is not None:
        pretrained = load_pretrained_siglip(config.vision_checkpoint, image_size=config.siglip.image_size,
                                            image_width=config.siglip.image_width)
        if pretrained.config != config.siglip:
            raise ValueError(f"{config.vision_checkpoint}: encoder {pretrained.config} does not match the "
                             f"configured {config.siglip}")
        model.vision_tower.load_state_dict(pretrained.state_dict(), strict=True)
    if config.decoder_checkpoint is not None:
        decoder = load_pretrained_gemma(config.decoder_checkpoint, vocab_size=config.gemma.vocab_size)
        if decoder.config != config.gemma:
            raise ValueError(f"{config.decoder_checkpoint}: decoder {decoder.config} does not match the "
                             f"configured {config.gemma}")
        model.language_model.load_state_dict(decoder.state_dict(), strict=True)
    return model
