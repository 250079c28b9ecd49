"""TrafficCommandTokenizer: vocabulary, encoding, batches, the VLM contract, vocab.json files."""

from __future__ import annotations

import functools
import json
import logging
import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vlm.config import ParamError
from vlm.tokenizer import (
    CONTRACT_ANSWER_WORDS,
    FIRST_WORD_ID,
    PUNCTUATION,
    SEP,
    SPECIAL_TOKENS,
    TrafficCommandTokenizer,
    coverage_by_split,
    vocab_metrics,
)

OBJECTS = {
    "car": "cars", "truck": "trucks", "bus": "buses", "pedestrian": "pedestrians", "rider": "riders",
    "bicycle": "bicycles", "motorcycle": "motorcycles", "train": "trains", "traffic sign": "traffic signs",
}
COLOURS = ("red", "yellow", "green")


def realistic_commands(n: int, seed: int) -> list[dict]:
    """Commands as generate_commands phrases them: several phrasings per command type."""
    rng = random.Random(seed)
    yes_no = ("yes", "no")

    def one() -> tuple[str, str, str]:
        obj = rng.choice(list(OBJECTS))
        objs = OBJECTS[obj]
        other = rng.choice(list(OBJECTS))
        side = rng.choice(("left", "right"))
        kind = rng.choice(("detection", "counting", "traffic_light", "spatial", "safety", "scene"))
        if kind == "detection":
            text = rng.choice((f"Is there a {obj}?", f"Are there any {objs}?", f"Can you see a {obj}?",
                               f"Is there a {obj} in the image?"))
            return kind, text, rng.choice(yes_no)
        if kind == "counting":
            if rng.random() < 0.5:
                text = rng.choice((f"How many {objs} are there?", f"How many {objs} can you see?",
                                   f"Count the {objs}."))
                return kind, text, str(rng.randrange(10))
            return kind, f"Are there more than {rng.randrange(1, 6)} {objs}?", rng.choice(yes_no)
        if kind == "traffic_light":
            if rng.random() < 0.5:
                text = rng.choice(("What color is the traffic light?", "What colour is the nearest traffic light?"))
                return kind, text, rng.choice(COLOURS)
            return kind, f"Is the traffic light {rng.choice(COLOURS)}?", rng.choice(yes_no)
        if kind == "spatial":
            text = rng.choice((f"Is there a {obj} on the {side} side?", f"Is the {obj} to the {side} of the {other}?"))
            return kind, text, rng.choice(("yes", "no", "maybe"))
        if kind == "safety":
            text = rng.choice((f"Can the car safely turn {side}?", "Is it safe to proceed?", "Should the car stop?"))
            return kind, text, rng.choice(("yes", "no", "maybe"))
        text = rng.choice(("Is it night?", "Is this a highway?", "Is it raining?", "Is this a city street?",
                           "Is the weather clear?"))
        return kind, text, rng.choice(yes_no)

    records = []
    for i in range(n):
        kind, text, answer = one()
        records.append({"question_id": f"q{seed}-{i}", "image_id": f"img{seed}-{i // 5}", "command": text,
                        "answer": answer, "command_type": kind})
    return records


@pytest.fixture(scope="module")
def train() -> list[dict]:
    return realistic_commands(2000, seed=0)


@pytest.fixture()
def tok(train) -> TrafficCommandTokenizer:
    return TrafficCommandTokenizer.build_vocab(train, min_freq=1, max_vocab_size=1000, max_length=32)


def cmd(command: str, answer: str = "yes") -> dict:
    return {"command": command, "answer": answer}


def encode(tok: TrafficCommandTokenizer, text: str, **kwargs) -> list[int]:
    """The ids of one text (its row of ``batch_encode`` without padding)."""
    batch = tok.batch_encode([text], **kwargs)
    return batch["input_ids"][0, : batch["length"][0]].tolist()


def word_ids(tok: TrafficCommandTokenizer, words: list[str]) -> list[int]:
    return [tok.vocab[w] for w in words]


# ---------------------------------------------------------------- vocabulary building


def test_special_tokens_reserved_ids_and_words_from_10(tok):
    vocab = tok.vocab
    assert {t: vocab[t] for t in SPECIAL_TOKENS} == {
        "[PAD]": 0, "[UNK]": 1, "[SOS]": 2, "[EOS]": 3, "[YES]": 4, "[NO]": 5, "[MAYBE]": 6, "[SEP]": 7}
    assert (vocab["[RESERVED_8]"], vocab["[RESERVED_9]"]) == (8, 9)
    assert sorted(vocab.values()) == list(range(tok.vocab_size))
    assert min(i for t, i in vocab.items() if not t.startswith("[")) == FIRST_WORD_ID
    assert (tok.pad_token_id, tok.unk_token_id, tok.sos_token_id, tok.eos_token_id) == (0, 1, 2, 3)


def test_words_ordered_by_frequency_then_alphabetically():
    commands = [cmd("b a c"), cmd("c a"), cmd("a"), cmd("d")]  # a:3, c:2, b:1, d:1
    tok = TrafficCommandTokenizer.build_vocab(commands)
    words = [t for t, i in sorted(tok.vocab.items(), key=lambda ti: ti[1]) if i >= FIRST_WORD_ID]
    assert words[:4] == ["a", "c", "b", "d"]
    assert "yes" not in tok.vocab  # the answer "yes" is the special token [YES]


def test_build_is_deterministic_whatever_the_order(train):
    shuffled = list(train)
    random.Random(1).shuffle(shuffled)
    a = TrafficCommandTokenizer.build_vocab(train)
    b = TrafficCommandTokenizer.build_vocab(shuffled)
    assert list(a.vocab.items()) == list(b.vocab.items())
    assert a.statistics == b.statistics


def test_answer_words_punctuation_and_contract_answers_always_included():
    commands = [cmd("How many cars?", "3"), cmd("How many cars?", "3"), cmd("What color?", "purple")]
    tok = TrafficCommandTokenizer.build_vocab(commands, min_freq=5, max_vocab_size=40)
    for word in ("purple", "3", *CONTRACT_ANSWER_WORDS, *PUNCTUATION):
        assert word in tok.vocab, word
    assert "cars" not in tok.vocab  # a question word below min_freq
    assert tok.statistics["num_dropped_min_freq"] == 5  # how, many, cars, what, color
    assert tok.encode_answer("purple") == [tok.vocab["purple"], tok.eos_token_id]


def test_min_freq_and_max_vocab_size():
    commands = [cmd("car car car bus bus tram")]
    tok = TrafficCommandTokenizer.build_vocab(commands, min_freq=2)
    assert "bus" in tok.vocab and "tram" not in tok.vocab
    forced = FIRST_WORD_ID + len(PUNCTUATION) + len(CONTRACT_ANSWER_WORDS)
    tok = TrafficCommandTokenizer.build_vocab(commands, max_vocab_size=forced + 1)
    assert tok.vocab_size == forced + 1
    assert "car" in tok.vocab and "bus" not in tok.vocab  # the most frequent word survives the cut
    assert tok.statistics["num_dropped_max_size"] == 2


def test_build_rejects_bad_params_and_records():
    with pytest.raises(ParamError, match="vocab.max_vocab_size"):
        TrafficCommandTokenizer.build_vocab([cmd("a")], max_vocab_size=12)
    with pytest.raises(ParamError, match="vocab.min_freq"):
        TrafficCommandTokenizer.build_vocab([cmd("a")], min_freq=0)
    with pytest.raises(ValueError, match=r"train.json: record 1 field 'answer'"):
        TrafficCommandTokenizer.build_vocab([cmd("a"), {"command": "b"}], source="train.json")
    with pytest.raises(ValueError, match="list of command records"):
        TrafficCommandTokenizer.build_vocab({"command": "a"})


def test_coverage_above_99_percent_on_held_out_splits(tok):
    splits = {"val": realistic_commands(400, seed=1), "test": realistic_commands(400, seed=2)}
    reports = coverage_by_split(tok, splits)
    for name, report in reports.items():
        assert report.coverage_pct >= 99.0, (name, report)
    metrics = vocab_metrics(tok, reports)
    assert metrics["vocab_size"] == tok.vocab_size
    assert set(metrics["val"]) == {"coverage_pct", "tokens", "oov_tokens", "oov_unique"}


def test_coverage_report_counts_oov(tok):
    report = tok.coverage(["Is there a zebra? A zebra, a camel.", "yes"])
    assert report.num_tokens == 12
    assert (report.num_oov, report.num_unique_oov) == (3, 2)
    assert report.top_oov == [("zebra", 2), ("camel", 1)]
    assert report.coverage_pct == pytest.approx(100 * 9 / 12)
    assert tok.unknown_word_counts == {}  # measuring coverage is not encoding


# ---------------------------------------------------------------- encoding and answers


def test_tokenize_normalises():
    assert TrafficCommandTokenizer.tokenize("  Is there\ta  CAR?!\n") == ["is", "there", "a", "car", "?", "!"]
    assert TrafficCommandTokenizer.tokenize("Ｉｓ ｔｈｅｒｅ ａ ｃａｒ？") == ["is", "there", "a", "car", "?"]  # NFKC
    assert TrafficCommandTokenizer.tokenize("cars,buses.") == ["cars", ",", "buses", "."]


def test_special_tokens_at_both_ends(tok):
    ids = encode(tok, "Is there a pedestrian on the left side?")
    words = ["is", "there", "a", "pedestrian", "on", "the", "left", "side", "?"]
    assert ids == [tok.sos_token_id, *word_ids(tok, words), tok.eos_token_id]
    assert encode(tok, "is there a bus", add_special_tokens=False) == word_ids(tok, ["is", "there", "a", "bus"])


def test_yes_no_maybe_are_the_answer_tokens(tok):
    assert encode(tok, "yes NO Maybe", add_special_tokens=False) == [4, 5, 6]
    assert [tok.decode_answer([i]) for i in (4, 5, 6)] == ["yes", "no", "maybe"]


def test_unknown_words_counted_per_occurrence_logged_once(tok, caplog):
    with caplog.at_level(logging.WARNING, logger="vlm.tokenizer"):
        for _ in range(3):  # the second and third calls hit the encode cache
            ids = encode(tok, "Is there a zebra or a Zebra?")
        tok.batch_encode(["zebra camel"] * 4)
    assert ids.count(tok.unk_token_id) == 3  # zebra, or, zebra
    assert tok.unknown_word_counts == {"zebra": 10, "or": 3, "camel": 4}
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 3 and all("[UNK]" in m for m in logged)
    assert tok.decode_answer(ids) == "is there a [UNK] [UNK] a [UNK]?"  # [UNK] stays visible


def test_decode_answer_rejects_ids_outside_the_vocabulary(tok):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode_answer([tok.vocab_size])
    with pytest.raises(ValueError, match="-100"):
        tok.decode_answer([2, -100])


# ---------------------------------------------------------------- batches and padding


def test_batch_shapes_dynamic_padding_to_multiple_of_8(tok):
    texts = ["Is it night?", "How many cars are there?", ""]
    batch = tok.batch_encode(texts)
    assert batch["input_ids"].shape == (3, 8) and batch["input_ids"].dtype == torch.int64
    assert batch["attention_mask"].dtype == torch.int64 and batch["length"].tolist() == [6, 8, 2]
    assert batch["attention_mask"].sum(1).tolist() == [6, 8, 2]
    assert (batch["input_ids"][batch["attention_mask"] == 0] == tok.pad_token_id).all()
    for row, text in enumerate(texts):
        assert batch["input_ids"][row, : batch["length"][row]].tolist() == encode(tok, text)
    long = tok.batch_encode(["Is there a car on the left side?"])  # 11 tokens -> 16
    assert long["input_ids"].shape == (1, 16)
    capped = tok.batch_encode(["Is there a car on the left side?"], max_length=12)  # 16 capped at 12
    assert capped["input_ids"].shape == (1, 12)


def test_padding_modes(tok):
    padded = tok.batch_encode(["Is it night?"], padding="max_length", max_length=12)
    assert padded["input_ids"][0, 5:].tolist() == [3] + [0] * 6
    assert padded["attention_mask"][0].tolist() == [1] * 6 + [0] * 6 and padded["length"].tolist() == [6]
    assert tok.batch_encode(["Is it night?"], padding="max_length")["input_ids"].shape == (1, 32)
    empty = tok.batch_encode([])
    assert empty["input_ids"].shape == (0, 0) and empty["length"].shape == (0,)
    with pytest.raises(ValueError, match="padding"):
        tok.batch_encode(["a"], padding=False)
    with pytest.raises(TypeError, match="sequence of strings"):
        tok.batch_encode("Is it night?")


def test_truncation_keeps_eos(tok):
    text = "car " * 250  # 1,000 characters
    assert len(text) == 1000
    ids = encode(tok, text, max_length=16)
    assert len(ids) == 16 and ids[0] == tok.sos_token_id and ids[-1] == tok.eos_token_id
    assert len(encode(tok, text)) == tok.max_length == 32  # the tokenizer's default
    assert len(encode(tok, text, truncation=False)) == 252
    batch = tok.batch_encode([text, "Is it night?"], max_length=16)
    assert batch["input_ids"].shape == (2, 16) and batch["input_ids"][0, -1] == tok.eos_token_id
    assert encode(tok, text, add_special_tokens=False, max_length=5) == [tok.vocab["car"]] * 5
    with pytest.raises(ValueError, match="max_length=1"):
        tok.batch_encode([text], max_length=1)


# ---------------------------------------------------------------- edge cases


def test_empty_string_gives_sos_eos(tok):
    assert encode(tok, "") == [tok.sos_token_id, tok.eos_token_id]
    assert encode(tok, "   \n\t ") == [2, 3]


def test_only_punctuation(tok):
    ids = encode(tok, "?!.,")
    assert ids[1:-1] == word_ids(tok, ["?", "!", ".", ","]) and tok.unk_token_id not in ids
    assert tok.decode_answer(ids) == "?!.,"


def test_special_characters_are_unknown_words_not_control_tokens(tok):
    ids = encode(tok, "[PAD] [SEP] <eos> @#$% car's")
    assert ids == [2, 1, 1, 1, 1, 1, 3]  # lower-cased "[pad]" is not the control token [PAD]
    assert encode(tok, "car\x00bus\u200b") == [2, 1, 3]  # one unknown non-space run


def test_numbers(tok):
    ids = encode(tok, "Are there more than 3 cars?")
    assert ids[5] == tok.vocab["3"]
    assert encode(tok, "Are there more than 12 cars?")[5] == tok.unk_token_id
    assert tok.decode_answer(encode(tok, "3.5")) == "3. 5"  # "." always splits


def test_repeated_words(tok):
    ids = encode(tok, "car car car car", add_special_tokens=False)
    assert ids == [tok.vocab["car"]] * 4
    assert tok.decode_answer(ids) == "car car car car"


def test_non_ascii_input(tok):
    assert encode(tok, "ＩＳ ＩＴ ＮＩＧＨＴ？") == encode(tok, "is it night?")
    ids = encode(tok, "Is there a café? Gibt es Straßenbahnen? 行人")
    assert ids.count(tok.unk_token_id) == 5  # café, gibt, es, straßenbahnen, 行人
    assert tok.decode_answer(ids) == "is there a [UNK]? [UNK] [UNK] [UNK]? [UNK]"


# ---------------------------------------------------------------- VLM contract


def test_question_and_answer_encoding(tok):
    q = tok.encode_question("Is there a bus?")
    assert q == [tok.sos_token_id, *word_ids(tok, ["is", "there", "a", "bus", "?"]), SEP]
    assert tok.encode_answer("yes") == [4, 3] and tok.encode_answer("no") == [5, 3]
    assert tok.encode_answer("maybe") == [6, 3]
    assert tok.encode_answer("red") == [tok.vocab["red"], 3] and tok.encode_answer("7") == [tok.vocab["7"], 3]
    for answer in ("yes", "no", "maybe", "red", "yellow", "green", *map(str, range(10))):
        assert tok.decode_answer(tok.encode_answer(answer) + [0, 0]) == answer
    assert tok.decode_answer(torch.tensor([tok.vocab["green"], 3, 4])) == "green"  # stops at [EOS]
    assert tok.decode_answer([3]) == ""


# ---------------------------------------------------------------- vocab.json


def test_save_load_equality(tok, tmp_path):
    path = tmp_path / "vocab.json"
    tok.save_vocab(path)
    loaded = TrafficCommandTokenizer.from_file(path)
    assert list(loaded.vocab.items()) == list(tok.vocab.items())
    assert (loaded.max_length, loaded.config, loaded.statistics) == (tok.max_length, tok.config, tok.statistics)
    texts = [r["command"] for r in realistic_commands(50, seed=3)]
    assert torch.equal(loaded.batch_encode(texts)["input_ids"], tok.batch_encode(texts)["input_ids"])
    data = json.loads(path.read_text())
    assert list(data) == ["format_version", "vocab_size", "special_tokens", "vocab", "config", "statistics"]
    loaded.save_vocab(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()


def _write(path, data) -> None:
    path.write_text(json.dumps(data))


def test_load_validation(tok, tmp_path):
    path = tmp_path / "vocab.json"
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        TrafficCommandTokenizer.from_file(path)
    path.write_text('{"vocab": [1, 2,]}')
    with pytest.raises(ValueError, match=r"vocab.json: invalid JSON at line 1, column 17"):
        TrafficCommandTokenizer.from_file(path)

    tok.save_vocab(path)
    good = json.loads(path.read_text())
    _write(path, {k: v for k, v in good.items() if k != "special_tokens"})
    with pytest.raises(ValueError, match="missing key 'special_tokens'"):
        TrafficCommandTokenizer.from_file(path)

    _write(path, good | {"vocab_size": good["vocab_size"] + 1})
    with pytest.raises(ValueError, match="vocab_size is"):
        TrafficCommandTokenizer.from_file(path)

    _write(path, good | {"vocab": good["vocab"] | {"extra": 5000}})
    with pytest.raises(ValueError, match=r"ids must be the integers 0\.\."):
        TrafficCommandTokenizer.from_file(path)

    _write(path, good | {"special_tokens": good["special_tokens"] | {"[SEP]": 9}})
    with pytest.raises(ValueError, match="special_tokens"):
        TrafficCommandTokenizer.from_file(path)

    _write(path, good | {"format_version": 99})
    with pytest.warns(UserWarning, match="format_version 99"):
        loaded = TrafficCommandTokenizer.from_file(path)
    assert loaded.vocab == tok.vocab


# ---------------------------------------------------------------- properties


@pytest.fixture(scope="module")
def module_tok(train) -> TrafficCommandTokenizer:
    return TrafficCommandTokenizer.build_vocab(train)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_encoding_never_raises_and_both_paths_agree(module_tok, text):
    batch = module_tok.batch_encode([text, text])
    length = int(batch["length"][0])
    ids = batch["input_ids"][0, :length].tolist()
    assert ids[0] == 2 and ids[-1] == 3 and 2 <= length <= module_tok.max_length
    assert all(0 <= i < module_tok.vocab_size for i in ids)
    assert batch["input_ids"][1].tolist() == batch["input_ids"][0].tolist()
    question = module_tok.encode_question(text)  # the dataset's path: never truncated
    assert question[0] == 2 and question[-1] == SEP and ids[1:-1] == question[1:-1][: module_tok.max_length - 2]


@functools.cache  # drawn from once per example: 2,000 commands tokenised once, not once per example
def _vocab_words() -> list[str]:
    words = {w for r in realistic_commands(2000, seed=0) for t in (r["command"], r["answer"])
             for w in TrafficCommandTokenizer.tokenize(t)}
    return sorted(words - set(PUNCTUATION))


@st.composite
def in_vocabulary_text(draw) -> tuple[str, list[str]]:
    """Text made of vocabulary words in any case, with punctuation and odd whitespace; its tokens."""
    token = st.sampled_from(_vocab_words()) | st.sampled_from(PUNCTUATION)
    tokens = draw(st.lists(token, max_size=40))
    case = st.sampled_from((str.lower, str.upper, str.title))
    space = st.sampled_from((" ", "  ", "\t", "\n ", "\u3000", "\u00a0"))
    full_width = {"?": "？", "!": "！", ",": "，", ".": "．"}
    parts = []
    for t in tokens:
        parts.append(draw(space))
        parts.append(full_width[t] if t in full_width and draw(st.booleans()) else draw(case)(t))
    return "".join(parts), [t.lower() for t in tokens]


def _reference_normal_form(tokens: list[str]) -> str:
    return re.sub(r" ([?.,!])", r"\1", " ".join(tokens))


@settings(max_examples=200, deadline=None)
@given(sample=in_vocabulary_text())
def test_decode_answer_encode_answer_is_the_normalised_text(module_tok, sample):
    text, tokens = sample
    ids = module_tok.encode_answer(text)
    assert module_tok.unk_token_id not in ids
    decoded = module_tok.decode_answer(ids)
    assert decoded == _reference_normal_form(tokens)
    assert TrafficCommandTokenizer.tokenize(decoded) == tokens
