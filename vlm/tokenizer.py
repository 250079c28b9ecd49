"""Word-level tokenizer for traffic commands and the vocabulary it is built from: a few hundred templates, so a closed
word vocabulary of the train split covers them. The ids, the normalisation and ``vocab.json``: docs/architecture.md."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
import unicodedata
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from vlm.config import check
from vlm.data.commands import check_commands
from vlm.io import read_json, write_json

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

VOCAB_FORMAT_VERSION = 1

PAD, UNK, SOS, EOS, YES, NO, MAYBE, SEP = range(8)
SPECIAL_TOKENS = {"[PAD]": PAD, "[UNK]": UNK, "[SOS]": SOS, "[EOS]": EOS, "[YES]": YES, "[NO]": NO, "[MAYBE]": MAYBE,
                  "[SEP]": SEP}
RESERVED_TOKENS = {"[RESERVED_8]": 8, "[RESERVED_9]": 9}
FIRST_WORD_ID = 10

ANSWER_TOKEN_WORDS = {"yes": YES, "no": NO, "maybe": MAYBE}  # answer words that are special tokens
# the rest of the commands contract's answers: always in the vocabulary, even when the train split misses one
CONTRACT_ANSWER_WORDS = ("red", "yellow", "green", *(str(n) for n in range(10)))

PUNCTUATION = ("?", ".", ",", "!")
_TOKEN_RE = re.compile(r"[?.,!]|[^\s?.,!]+")  # a punctuation mark, or a run of neither whitespace nor punctuation

CONTROL_IDS = frozenset({PAD, SOS, EOS, SEP, *RESERVED_TOKENS.values()})  # no words: decode_answer drops them

_TEXT_FIELDS = ("command", "answer")  # the fields of a command record that the vocabulary is built from and covers

ENCODE_CACHE_SIZE = 100_000  # distinct strings kept encoded: commands repeat (templates), any text is bounded


@dataclasses.dataclass
class VocabConfig:
    """The ``vocab:`` section of params.yaml."""

    min_freq: int = 1  # a train word seen fewer times becomes [UNK] (answer words always stay)
    max_vocab_size: int = 1000  # total ids, special and reserved included
    max_length: int = 32  # default truncation length of batch_encode, specials included

    def validate(self, prefix: str = "vocab") -> None:
        check(self.min_freq >= 1, f"{prefix}.min_freq", f"must be >= 1, got {self.min_freq}")
        required = FIRST_WORD_ID + len(PUNCTUATION) + len(CONTRACT_ANSWER_WORDS)
        check(self.max_vocab_size >= required, f"{prefix}.max_vocab_size",
              f"must be >= {required} (special ids, punctuation and answer words), got {self.max_vocab_size}")
        check(self.max_length >= 3, f"{prefix}.max_length", f"must be >= 3 ([SOS] word [EOS]), got {self.max_length}")


@dataclasses.dataclass
class CoverageReport:
    """How much of a text collection the vocabulary covers, counted over tokens (words and punctuation)."""

    num_tokens: int
    num_oov: int  # tokens that map to [UNK]
    top_oov: list[tuple[str, int]]  # most frequent unknown words, ties alphabetical
    num_unique_oov: int

    @property
    def coverage_pct(self) -> float:
        return 100.0 * (self.num_tokens - self.num_oov) / self.num_tokens if self.num_tokens else 100.0


class TrafficCommandTokenizer:
    """Word-level tokenizer with fixed special ids: :meth:`encode_question` / :meth:`encode_answer` give the VLM's ids,
    :meth:`batch_encode` padded tensors, :meth:`decode_answer` an answer back ([UNK] stays visible)."""

    def __init__(self, vocab: dict[str, int], *, max_length: int | None = 32, statistics: dict | None = None,
                 config: dict | None = None):
        _check_vocab_ids(vocab, "vocab")
        self.max_length = max_length
        self.statistics = dict(statistics or {})
        self.config = dict(config or {"max_length": max_length})
        self._token_to_id = dict(vocab)
        self._id_to_token = sorted(vocab, key=vocab.__getitem__)  # index = id
        # Word -> id for encoding: vocabulary words plus "yes"/"no"/"maybe" -> answer tokens.
        self._word_to_id = {t: i for t, i in vocab.items() if i >= FIRST_WORD_ID} | ANSWER_TOKEN_WORDS
        self._id_to_text = list(self._id_to_token)  # for decoding: [YES]/[NO]/[MAYBE] are "yes"/"no"/"maybe"
        for word, token_id in ANSWER_TOKEN_WORDS.items():
            self._id_to_text[token_id] = word
        self._encode_cache: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {}
        self.unknown_word_counts: Counter[str] = Counter()  # occurrences of each word mapped to [UNK]

    @classmethod
    def build_vocab(cls, commands: Sequence[dict], min_freq: int = 1, max_vocab_size: int = 1000,
                    max_length: int = 32, source: str = "commands") -> TrafficCommandTokenizer:
        """Build the vocabulary of command records (``source`` names them in errors), ordered as docs/architecture.md
        says: every answer word whatever its count, others from ``min_freq`` on, the least frequent cut to fit."""
        VocabConfig(min_freq, max_vocab_size, max_length).validate("vocab")
        check_commands(commands, source, _TEXT_FIELDS)
        counts: Counter[str] = Counter()
        answer_words: set[str] = set()
        for record in commands:
            counts.update(cls.tokenize(record["command"]))
            answer = cls.tokenize(record["answer"])
            counts.update(answer)
            answer_words.update(answer)

        required = (set(PUNCTUATION) | set(CONTRACT_ANSWER_WORDS) | answer_words) - ANSWER_TOKEN_WORDS.keys()
        room = max_vocab_size - FIRST_WORD_ID - len(required)
        if room < 0:
            raise ValueError(f"{source}: max_vocab_size={max_vocab_size} leaves no room for the {len(required)} "
                             f"punctuation and answer words that must be in the vocabulary")
        candidates = [w for w in counts if w not in required and w not in ANSWER_TOKEN_WORDS]
        frequent = sorted((w for w in candidates if counts[w] >= min_freq), key=lambda w: (-counts[w], w))
        words = sorted(required | set(frequent[:room]), key=lambda w: (-counts[w], w))

        vocab = SPECIAL_TOKENS | RESERVED_TOKENS | {w: FIRST_WORD_ID + i for i, w in enumerate(words)}
        config = {"min_freq": min_freq, "max_vocab_size": max_vocab_size, "max_length": max_length}
        tokenizer = cls(vocab, max_length=max_length, config=config)
        report = tokenizer.coverage(_command_texts(commands))
        tokenizer.statistics = {
            "num_commands": len(commands), "num_tokens": sum(counts.values()), "num_distinct_tokens": len(counts),
            "num_words": len(words), "num_dropped_min_freq": sum(1 for w in candidates if counts[w] < min_freq),
            "num_dropped_max_size": max(0, len(frequent) - room), "coverage_pct": round(report.coverage_pct, 4),
            "most_common": [[w, counts[w]] for w in words[:20] if counts[w] > 0],
        }
        return tokenizer

    @staticmethod
    def tokenize(text: str) -> list[str]:
        """NFKC-normalise, lower-case and split ``text`` into words and ``? . , !`` marks."""
        if not isinstance(text, str):
            raise TypeError(f"tokenize expects a str, got {type(text).__name__}")
        return _TOKEN_RE.findall(unicodedata.normalize("NFKC", text).lower())

    def batch_encode(self, texts: Sequence[str], add_special_tokens: bool = True,
                     padding: Literal[True, "max_length"] = True, max_length: int | None = None,
                     truncation: bool = True) -> dict[str, torch.Tensor]:
        """Encode texts into right-padded int64 ``input_ids`` ``[B, L]``, ``attention_mask`` ``[B, L]`` (1 on tokens),
        ``length`` ``[B]``; ``add_special_tokens``: [SOS] ... [EOS]. ``max_length`` (default: the tokenizer's) counts
        them; ``truncation`` cuts words from the end, [EOS] kept. ``padding=True``: L = the longest rounded up to 8,
        capped at ``max_length`` when truncating; ``"max_length"``: L = ``max_length``."""
        if isinstance(texts, str):
            raise TypeError("batch_encode expects a sequence of strings, got one str")
        if padding not in (True, "max_length"):
            raise ValueError(f"batch_encode returns tensors: padding must be True or 'max_length', got {padding!r}")
        max_length = self.max_length if max_length is None else max_length
        num_special = 2 if add_special_tokens else 0
        if max_length is not None and max_length < num_special:
            raise ValueError(f"max_length={max_length} cannot hold [SOS] and [EOS]")
        if padding == "max_length" and max_length is None:
            raise ValueError("padding='max_length' needs max_length (the tokenizer has none)")

        word_ids = self._word_ids
        bodies = [word_ids(text) for text in texts]  # word ids without special tokens
        body_lengths = np.fromiter(map(len, bodies), dtype=np.int64, count=len(bodies))  # [B]
        if truncation and max_length is not None:
            max_body = max_length - num_special
            if body_lengths.size and body_lengths.max() > max_body:
                bodies = [body[:max_body] for body in bodies]
                np.minimum(body_lengths, max_body, out=body_lengths)
        lengths = body_lengths + num_special  # [B]

        longest = int(lengths.max()) if lengths.size else 0
        if padding == "max_length":
            seq_len = max(max_length, longest)  # longer only when not truncating
        else:
            seq_len = -(-longest // 8) * 8  # dynamic: round up to a multiple of 8 ...
            if truncation and max_length is not None:
                seq_len = max(min(seq_len, max_length), longest)  # ... but not past max_length

        positions = np.arange(seq_len)  # [L]
        attention_mask = (positions < lengths[:, None]).astype(np.int64)  # [B, L]
        input_ids = np.full((len(bodies), seq_len), PAD, dtype=np.int64)  # [B, L]
        flat_ids = np.fromiter(itertools.chain.from_iterable(bodies), dtype=np.int64, count=int(body_lengths.sum()))
        if add_special_tokens and len(bodies):
            input_ids[:, 0] = SOS
            body_mask = (positions >= 1) & (positions <= body_lengths[:, None])  # [B, L]
            input_ids[body_mask] = flat_ids
            input_ids[np.arange(len(bodies)), lengths - 1] = EOS
        else:
            input_ids[attention_mask.astype(bool)] = flat_ids
        import torch  # noqa: PLC0415 (build_vocab, which builds the vocabulary, runs without torch)

        return {name: torch.from_numpy(array) for name, array in
                (("input_ids", input_ids), ("attention_mask", attention_mask), ("length", lengths))}

    def encode_question(self, text: str) -> list[int]:
        """The prefix text of a VLM example: ``[SOS] w1 ... wn [SEP]`` (never truncated)."""
        return [SOS, *self._word_ids(text), SEP]

    def encode_answer(self, text: str) -> list[int]:
        """Answer ids followed by [EOS]: "yes" -> [[YES], [EOS]], "red" -> [id("red"), [EOS]]."""
        return [*self._word_ids(text), EOS]

    def _word_ids(self, text: str) -> tuple[int, ...]:
        """Ids of the words of ``text`` (no special tokens); unknown words counted and logged."""
        entry = self._encode_cache.get(text)
        if entry is None:
            words = self.tokenize(text)
            ids = tuple([self._word_to_id.get(w, UNK) for w in words])
            entry = ids, tuple(w for w, i in zip(words, ids) if i == UNK)
            if len(self._encode_cache) < ENCODE_CACHE_SIZE:
                self._encode_cache[text] = entry
        for word in entry[1]:  # the unknown words
            if word not in self.unknown_word_counts:
                logger.warning("unknown word %r encoded as [UNK] (logged once per word)", word)
            self.unknown_word_counts[word] += 1
        return entry[0]

    def decode_answer(self, ids: Iterable[int] | torch.Tensor | np.ndarray) -> str:
        """Inverse of :meth:`encode_answer` ([YES] -> "yes"; stops at [EOS]), punctuation joined to the word before."""
        if hasattr(ids, "ndim"):  # a tensor or an array
            if ids.ndim != 1:
                raise ValueError(f"expected a 1-D sequence of ids, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        words: list[str] = []
        for token_id in map(int, ids):
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")
            if token_id == EOS:
                break
            if token_id not in CONTROL_IDS:
                words.append(self._id_to_text[token_id])
        return "".join(w if not i or w in PUNCTUATION else " " + w for i, w in enumerate(words))

    def coverage(self, texts: Iterable[str], top_k: int = 10) -> CoverageReport:
        """Share of the tokens of ``texts`` that have an id (no logging, no counting side effects)."""
        counts = Counter(itertools.chain.from_iterable(map(self.tokenize, texts)))
        oov = {w: c for w, c in counts.items() if w not in self._word_to_id}
        top_oov = sorted(oov.items(), key=lambda wc: (-wc[1], wc[0]))[:top_k]
        return CoverageReport(sum(counts.values()), sum(oov.values()), top_oov, len(oov))

    @property
    def vocab_size(self) -> int:
        return len(self._id_to_token)

    @property
    def vocab(self) -> dict[str, int]:
        return dict(self._token_to_id)

    pad_token_id = property(lambda self: PAD)
    unk_token_id = property(lambda self: UNK)
    sos_token_id = property(lambda self: SOS)
    eos_token_id = property(lambda self: EOS)  # generate's eos_token_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, max_length={self.max_length})"

    def save_vocab(self, path: str | os.PathLike) -> None:
        """Write ``vocab.json`` atomically (its keys: docs/architecture.md, build_vocab)."""
        write_json(path, {"format_version": VOCAB_FORMAT_VERSION, "vocab_size": self.vocab_size,
                          "special_tokens": dict(SPECIAL_TOKENS),
                          "vocab": {token: i for i, token in enumerate(self._id_to_token)},
                          "config": self.config, "statistics": self.statistics})

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> TrafficCommandTokenizer:
        """Read a ``vocab.json`` written by :meth:`save_vocab`: a missing file raises FileNotFoundError, bad JSON or a
        missing or invalid key ValueError naming it; another format version only warns."""
        path = Path(path)
        data = read_json(path, "vocab file")
        if not isinstance(data, dict):
            raise ValueError(f"{path}: top level must be an object, got {type(data).__name__}")
        for key in ("format_version", "vocab_size", "special_tokens", "vocab", "config", "statistics"):
            if key not in data:
                raise ValueError(f"{path}: missing key '{key}'")
        if data["format_version"] != VOCAB_FORMAT_VERSION:
            warnings.warn(f"{path}: format_version {data['format_version']!r}, this code reads version "
                          f"{VOCAB_FORMAT_VERSION}; loading anyway", stacklevel=2)
        if data["special_tokens"] != SPECIAL_TOKENS:
            raise ValueError(f"{path}: special_tokens must be {SPECIAL_TOKENS}, got {data['special_tokens']}")
        vocab = data["vocab"]
        _check_vocab_ids(vocab, f"{path}: vocab")
        if data["vocab_size"] != len(vocab):
            raise ValueError(f"{path}: vocab_size is {data['vocab_size']} but vocab has {len(vocab)} entries")
        config = data["config"]
        if not isinstance(config, dict) or "max_length" not in config:
            raise ValueError(f"{path}: missing key 'config.max_length'")
        return cls(vocab, max_length=config["max_length"], statistics=data["statistics"], config=config)


def coverage_by_split(tokenizer: TrafficCommandTokenizer,
                      splits: dict[str, Sequence[dict]]) -> dict[str, CoverageReport]:
    """Coverage of the commands and answers of each split."""
    return {name: tokenizer.coverage(_command_texts(commands)) for name, commands in splits.items()}


def vocab_metrics(tokenizer: TrafficCommandTokenizer, reports: dict[str, CoverageReport]) -> dict[str, Any]:
    """``metrics/vocab.json``: vocabulary size and, per split, coverage and OOV counts (numbers only)."""
    return {"vocab_size": tokenizer.vocab_size, "num_words": tokenizer.vocab_size - FIRST_WORD_ID} | {
        name: {"coverage_pct": round(report.coverage_pct, 4), "tokens": report.num_tokens,
               "oov_tokens": report.num_oov, "oov_unique": report.num_unique_oov}
        for name, report in reports.items()}


def _command_texts(commands: Iterable[dict]) -> Iterable[str]:
    for record in commands:
        for field in _TEXT_FIELDS:
            yield record[field]


def _check_vocab_ids(vocab: Any, what: str) -> None:
    """Special and reserved tokens at their fixed ids, every id 0..N-1 used exactly once."""
    if not isinstance(vocab, dict):
        raise ValueError(f"{what}: must be an object mapping token -> id")
    for token, token_id in (SPECIAL_TOKENS | RESERVED_TOKENS).items():
        if vocab.get(token) != token_id:
            raise ValueError(f"{what}: '{token}' must have id {token_id}, got {vocab.get(token)!r}")
    ids = list(vocab.values())
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids) or sorted(ids) != list(range(len(ids))):
        raise ValueError(f"{what}: ids must be the integers 0..{len(vocab) - 1}, each used once")
