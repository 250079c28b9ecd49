"""The processor: images and questions (and answers) -> a :class:`vlm.batch.Batch`, as HuggingFace's
``PaliGemmaProcessor``; :func:`make_batch` lays out the token sequences for the training collate too."""

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Protocol

import numpy as np
import torch
from PIL import Image

from vlm.batch import IGNORE_INDEX, Batch
from vlm.data.image import decode_image


class QATokenizer(Protocol):
    """What the processor and the dataset need of the tokenizer."""

    pad_token_id: int

    def encode_question(self, text: str) -> list[int]: ...

    def encode_answer(self, text: str) -> list[int]: ...


def make_batch(images: torch.Tensor | None, image_index: Sequence[int], question_ids: Sequence[torch.Tensor],
               answer_ids: Sequence[torch.Tensor] | None = None, pad_token_id: int = 0, **fields) -> Batch:
    """A right-padded :class:`Batch` of B questions: ``input_ids`` = question + answer ids (if any), ``labels`` on the
    answer tokens ([EOS] included), else ``IGNORE_INDEX`` (None without answers). ``images`` uint8 ``[N_img, 3, H, W]``:
    each distinct image once, ``image_index`` ``[B]``: each question's; ``fields``: the Batch's others."""
    question_lengths = torch.tensor([len(q) for q in question_ids], dtype=torch.int64)  # [B]
    if answer_ids is None:
        lengths, parts = question_lengths, list(question_ids)
    else:
        lengths = question_lengths + torch.tensor([len(a) for a in answer_ids], dtype=torch.int64)  # [B]
        parts = [ids for pair in zip(question_ids, answer_ids) for ids in pair]
    positions = torch.arange(int(lengths.max()))  # [L]
    attention_mask = positions[None, :] < lengths[:, None]  # [B, L] bool
    input_ids = torch.full(attention_mask.shape, pad_token_id, dtype=torch.int64)  # [B, L]
    input_ids[attention_mask] = torch.cat(parts)  # row-major order of the True cells = the ids' order
    labels = None
    if answer_ids is not None:
        is_answer = attention_mask & (positions[None, :] >= question_lengths[:, None])  # [B, L]
        labels = torch.where(is_answer, input_ids, IGNORE_INDEX)  # [B, L]
    return Batch(images=images, image_index=torch.as_tensor(image_index, dtype=torch.int64),
                 input_ids=input_ids, attention_mask=attention_mask.to(torch.int64),
                 prefix_lengths=question_lengths, labels=labels, **fields)


@dataclass
class Processor:
    tokenizer: QATokenizer
    image_size: int  # the packed images' height (and width when square)
    resample: str  # the filter they were packed with
    image_width: int | None = None  # their width; None: square
    aspect: float | None = None  # an image of another aspect is first letterboxed to this one; None: squashed

    def image(self, source: str | os.PathLike | IO[bytes]) -> torch.Tensor:
        """uint8 ``[3, H, W]`` of an image file or file object (any size and format), turned upright as its EXIF
        orientation says, decoded and resized as the pack stage does or, with ``aspect``, letterboxed to it first (a
        photo of another aspect: 4:3, portrait)."""
        pixels = decode_image(source, self.image_size, self.resample, self.image_width, self.aspect,
                              upright=True)  # [H, W, 3]
        return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))

    def rendered(self, image: Image.Image, jpeg_quality: int) -> torch.Tensor:
        """uint8 ``[3, H, W]`` of a freshly drawn frame as packed: saved as the scenes stage saves JPEGs, then read."""
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=jpeg_quality)
        buffer.seek(0)
        return self.image(buffer)

    def __call__(self, images: Sequence[torch.Tensor], questions: Sequence[str],
                 image_index: Sequence[int] | None = None, answers: Sequence[str] | None = None, **fields) -> Batch:
        """A Batch asking ``questions`` of ``images`` (whose: ``image_index``, default one each), with ``answers``."""
        question_ids = [torch.tensor(self.tokenizer.encode_question(q)) for q in questions]
        answer_ids = None if answers is None else [torch.tensor(self.tokenizer.encode_answer(a)) for a in answers]
        return make_batch(torch.stack(list(images)), range(len(questions)) if image_index is None else image_index,
                          question_ids, answer_ids, self.tokenizer.pad_token_id, **fields)
