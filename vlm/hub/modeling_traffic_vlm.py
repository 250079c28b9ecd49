"""The project's model as a transformers model: ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` on an
export of vlm/export.py, whose folder holds this file and the project modules it imports (vlm/hub/vendor.py).
:meth:`TrafficVLMForQuestionAnswering.answer` answers as ``python -m vlm.predict`` does: the same pixels, tokens,
mirror image and answer set, so the same probabilities."""

import difflib
import logging
import os
import re
from collections.abc import Sequence
from typing import IO

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from vlm.data.image import decode_image
from vlm.data.mirror import swap_left_right
from vlm.hub.configuration_traffic_vlm import TrafficVLMConfig
from vlm.processor import make_batch
from vlm.traffic_vlm import VLMConfig, build_vlm

logger = logging.getLogger(__name__)


class TrafficVLMForQuestionAnswering(PreTrainedModel):
    config_class = TrafficVLMConfig
    base_model_prefix = "vlm"
    main_input_name = "images"
    # the decoder's output layer is its token embedding (vlm/models/gemma.py); the export stores it once
    _tied_weights_keys = {"vlm.language_model.lm_head.weight": "vlm.language_model.model.embed_tokens.weight"}

    def __init__(self, config: TrafficVLMConfig):
        super().__init__(config)
        self.vlm = build_vlm(VLMConfig.from_dict(config.vlm, what="config.json: vlm"), pretrained=False)
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Every weight comes from model.safetensors; the buffers it does not hold, from :meth:`from_pretrained`."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' loading, then the buffers the modules compute from the config (non-persistent: rotary
        frequencies, pixel scaling, region masks), which it builds on the meta device and leaves unset."""
        model = super().from_pretrained(*args, **kwargs)
        with torch.random.fork_rng(devices=[]):  # its random weights, never used, leave the caller's seed as it was
            built = build_vlm(VLMConfig.from_dict(model.config.vlm, what="config.json: vlm"), pretrained=False)
        for name, buffer in built.named_buffers():
            if name.rpartition(".")[2] in model.vlm.get_submodule(name.rpartition(".")[0])._non_persistent_buffers_set:
                model.vlm.get_buffer(name).copy_(buffer)
        return model

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.vlm.language_model.model.embed_tokens

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.vlm.language_model.lm_head

    def image(self, source: str | os.PathLike | IO[bytes]) -> torch.Tensor:
        """uint8 ``[3, H, W]`` of an image file of any size and format, as ``vlm.predict`` reads it."""
        image = self.config.image
        pixels = decode_image(source, image["height"], image["resample"], image["width"], image["aspect"],
                              upright=True)  # [H, W, 3]
        return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                image_index: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, L, V]`` at the text positions of questions ``input_ids`` ``[B, L]`` (the tokenizer's, right
        padded) about uint8 ``images`` ``[N, 3, H, W]`` (question b's: ``image_index[b]``, default b)."""
        lengths = attention_mask.sum(1)  # [B]
        rows = range(len(input_ids)) if image_index is None else image_index
        batch = make_batch(images, rows, [ids[:n] for ids, n in zip(input_ids, lengths)],
                           pad_token_id=self.config.pad_token_id or 0)
        return self.vlm(batch.to(images.device)).logits

    @torch.no_grad()
    def answer(self, images: Sequence[str | os.PathLike | IO[bytes]], question: str,
               tokenizer: PreTrainedTokenizerBase) -> list[list[tuple[str, float]]]:
        """For each image file, the answers the question's template can give with their probabilities, most probable
        first (every answer for a question of no template, with a warning naming the closest phrasings)."""
        self._check_question(question, tokenizer)
        fitting = self._fitting_answers(question)  # [C]
        device = next(self.parameters()).device
        asked = [([self.image(source) for source in images], question)]
        if self.vlm.config.mirror_answers:  # the mean with the mirror image asked the left/right-swapped question
            asked.append(([image.flip(-1) for image in asked[0][0]], swap_left_right(question)))
        probs = torch.zeros(len(images), len(self.config.answers))  # [N, C]
        for pictures, text in asked:
            ids = torch.tensor(tokenizer(text)["input_ids"])
            batch = make_batch(torch.stack(pictures), range(len(pictures)), [ids] * len(pictures),
                               pad_token_id=tokenizer.pad_token_id).to(device)
            probs += self.vlm.answer(batch, self.config.candidates).float().cpu() / len(asked)
        kept = torch.where(fitting, probs, 0.0)
        probs = kept / kept.sum(1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
        return [[(self.config.answers[i], float(row[i])) for i in np.argsort(-row.numpy(), kind="stable")
                 if fitting[i]] for row in probs]

    def _check_question(self, question: str, tokenizer: PreTrainedTokenizerBase) -> None:
        """Refuse a question with no words, or none the model was trained on (as ``vlm.predict``)."""
        words = [t for t in tokenizer.tokenize(question) if any(ch.isalnum() for ch in t)]
        if not words:
            raise ValueError(f"question {question!r}: has no words; ask e.g. \"Is there a pedestrian?\"")
        if all(word == tokenizer.unk_token for word in words):
            raise ValueError(f"question {question!r}: none of its words is in the model's vocabulary; the model was "
                             f"trained on questions like \"Is there a pedestrian?\"")

    def _fitting_answers(self, question: str) -> torch.Tensor:
        """bool ``[C]``: the answers of the question's template (vlm.commands.templates.fitting_answers)."""
        text = " ".join(question.split()).rstrip("?").rstrip()
        answers = np.asarray(self.config.answers, dtype=object)
        for template in self.config.templates:
            if any(re.fullmatch(pattern, text, re.IGNORECASE) for pattern in template["patterns"]):
                fits = np.isin(answers, template["answers"])
                return torch.from_numpy(fits if fits.any() else np.ones(len(answers), bool))
        phrasings = [p for template in self.config.templates for p in template["phrasings"]]
        closest = "; ".join(f'"{p}"' for p in difflib.get_close_matches(question, phrasings, n=3, cutoff=0.0))
        logger.warning("question %r is no phrasing the model was trained on, so every answer is scored; the "
                       "closest: %s", question, closest)
        return torch.ones(len(answers), dtype=torch.bool)
