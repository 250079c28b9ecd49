"""One decoder row per image ``[image tokens | q1 a1 | q2 a2 | ... | padding]`` (``pack_questions``; departure 8 in
docs/architecture.md): each question sees the image tokens and its own, at the RoPE positions it would have alone."""

from __future__ import annotations

from dataclasses import dataclass

import torch

IMAGE, PADDING = -1, -2  # segment ids of the image and padding slots; question b's tokens have segment b


@dataclass
class PackedRows:
    row: torch.Tensor  # [B] the decoder row of question b (its image's)
    rank: torch.Tensor  # [B] the place of question b among its row's questions
    slots: torch.Tensor  # [B, L] the row slot of text position t of question b (past its end: its last token's)
    text_tokens: torch.Tensor  # [2, M] the questions' M tokens: (question b, text position t) of each
    position_ids: torch.Tensor  # [N, S] RoPE positions: 0..T-1 on the image, T + t on question text position t
    mask: torch.Tensor  # bool [N, 1, S, S] True: may attend
    questions_per_row: int  # K: the most questions of one row

    @classmethod
    def build(cls, image_index: torch.Tensor, num_rows: int, num_image_tokens: int,
              attention_mask: torch.Tensor, prefix_lengths: torch.Tensor) -> PackedRows:
        """The layout of B right-padded questions in ``num_rows`` rows (``image_index``), after the image slots.
        It reads back from the device twice (where the tokens are, the rows' sizes): the model builds it before the
        image tokens, so that on a GPU the reads wait for the batch's copy alone; :meth:`pack` then reads nothing
        (it indexes by ``text_tokens`` where a boolean mask would read back its count)."""
        device = attention_mask.device
        num, length = attention_mask.shape
        image_slots = num_image_tokens
        text_valid = attention_mask.bool()  # [B, L]
        lengths = text_valid.sum(1)  # [B]
        order = torch.sort(image_index, stable=True).indices  # [B] questions grouped by row, in batch order
        sorted_rows = image_index[order]
        row_tokens = torch.zeros(num_rows, dtype=lengths.dtype, device=device).index_add_(0, image_index, lengths)
        row_questions = torch.zeros_like(row_tokens).index_add_(0, image_index, torch.ones_like(lengths))  # [N]
        before_row = row_tokens.cumsum(0) - row_tokens  # [N] tokens of the earlier rows, in sorted order
        start, rank = torch.empty_like(lengths), torch.empty_like(lengths)  # [B] each
        start[order] = lengths[order].cumsum(0) - lengths[order] - before_row[sorted_rows]
        rank[order] = torch.arange(num, device=device) - (row_questions.cumsum(0) - row_questions)[sorted_rows]
        offsets = torch.arange(length, device=device)  # [L]
        slots = image_slots + start[:, None] + torch.minimum(offsets, lengths[:, None] - 1)  # [B, L]
        text_tokens = text_valid.nonzero().T  # [2, M]: a read
        row_length, most_questions = torch.stack([row_tokens.max(), row_questions.max()]).tolist()  # the other
        size = image_slots + row_length  # S

        # per slot: its segment, its position (RoPE and causal order) and the end of its segment's prefix
        def text(values: torch.Tensor) -> torch.Tensor:  # [B, L] (or broadcast to it) -> [M] on the text tokens
            return values.expand(num, length)[text_tokens[0], text_tokens[1]]

        text_rows, text_slots = text(image_index[:, None]), text(slots)
        segment = torch.full((num_rows, size), PADDING, dtype=torch.int64, device=device)
        segment[:, :image_slots] = IMAGE
        segment[text_rows, text_slots] = text(torch.arange(num, device=device)[:, None])
        position_ids = torch.zeros(num_rows, size, dtype=torch.int64, device=device)
        position_ids[:, :image_slots] = torch.arange(image_slots, device=device)
        position_ids[text_rows, text_slots] = text(image_slots + offsets)
        prefix_end = torch.full((num_rows, size), image_slots, dtype=torch.int64, device=device)
        prefix_end[text_rows, text_slots] = text((image_slots + prefix_lengths)[:, None])

        query, key = (slice(None), slice(None), None), (slice(None), None, slice(None))
        in_order = (position_ids[key] <= position_ids[query]) | (position_ids[key] < prefix_end[query])
        visible = (segment[key] == IMAGE) | ((segment[key] == segment[query]) & in_order)  # [N, S, S]
        visible = visible & (segment[key] != PADDING)
        # a padding slot sees itself, so that no softmax row is empty
        visible = visible | torch.eye(size, dtype=torch.bool, device=device)
        return cls(row=image_index, rank=rank, slots=slots, text_tokens=text_tokens, position_ids=position_ids,
                   mask=visible[:, None], questions_per_row=most_questions)

    def pack(self, image_tokens: torch.Tensor, text_embeds: torch.Tensor) -> torch.Tensor:
        """``image_tokens`` ``[N, T, D]`` and each question's ``text_embeds`` ``[B, L, D]`` -> rows ``[N, S, D]``."""
        num_rows, image_slots, dim = image_tokens.shape
        size = self.position_ids.shape[1]
        question, position = self.text_tokens  # [M] each
        text = text_embeds.new_zeros(num_rows, size - image_slots, dim)
        text = text.index_put((self.row[question], self.slots[question, position] - image_slots),
                              text_embeds[question, position])
        return torch.cat([image_tokens.to(text.dtype), text], dim=1)

    def row_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """Slots ``[B, Q]`` of each question -> ``[N, K * Q]``: question b's at columns ``rank[b] * Q + q`` of its
        row (slot 0 where a row has fewer questions), the layout :meth:`unpack` reads back."""
        num, per_question = slots.shape
        columns = self._columns(per_question)
        table = slots.new_zeros(self.mask.shape[0], self.questions_per_row * per_question)
        return table.index_put((self.row[:, None].expand(num, per_question), columns), slots)

    def unpack(self, hidden: torch.Tensor, per_question: int) -> torch.Tensor:
        """``hidden`` ``[N, K * Q, D]`` at :meth:`row_slots`' columns -> ``[B, Q, D]`` per question."""
        return hidden[self.row[:, None], self._columns(per_question)]

    def _columns(self, per_question: int) -> torch.Tensor:
        """``[B, Q]``: question b's ``Q`` columns in its row's output table, ``rank[b] * Q + q``."""
        return self.rank[:, None] * per_question + torch.arange(per_question, device=self.rank.device)
