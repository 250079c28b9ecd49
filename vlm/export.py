"""Export a trained model for transformers: ``python -m vlm.export --checkpoint models/vlm.pt --out models/hf``.
A model of PaliGemma's plain design becomes a folder that ``PaliGemmaForConditionalGeneration`` and ``AutoProcessor``
(or ``AutoTokenizer`` alone) load (:data:`FILES`; the token layout's mapping: docs/architecture.md, the model). Any
other (:func:`departures`: the default's perception, pixel shuffle, packed questions, mirror answers, 224 x 128 px)
becomes a folder with its own code, which ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` loads with
transformers alone (:mod:`vlm.hub`); ``--plain`` refuses it instead, naming what to change."""

import argparse
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

from vlm.checkpoint import LoadedModel, load_model
from vlm.cli import run
from vlm.commands.templates import TEMPLATES
from vlm.data.image import RESAMPLE
from vlm.hub import vendor
from vlm.io import atomic_path
from vlm.tokenizer import (
    ANSWER_TOKEN_WORDS,
    EOS,
    FIRST_WORD_ID,
    PAD,
    PUNCTUATION,
    RESERVED_TOKENS,
    SEP,
    SOS,
    SPECIAL_TOKENS,
    UNK,
)
from vlm.traffic_vlm import VLMConfig

IMAGE_TOKEN, IMAGE_TOKEN_ID = "<image>", RESERVED_TOKENS["[RESERVED_8]"]  # a reserved id is free in every vocabulary
# Special tokens by id: vlm/tokenizer.py's but [YES], [NO], [MAYBE] (words, named by their word), the image
# placeholder on its reserved id.
SPECIAL = {i: IMAGE_TOKEN if i == IMAGE_TOKEN_ID else name for name, i in (SPECIAL_TOKENS | RESERVED_TOKENS).items()
           if i not in ANSWER_TOKEN_WORDS.values()}
# vlm/tokenizer.py's token pattern for the Oniguruma regexes of ``tokenizers``, whose \s lacks Python's \x1c-\x1f.
_PUNCTUATION = "".join("\\" + mark for mark in PUNCTUATION)
TOKEN_PATTERN = f"[{_PUNCTUATION}]|[^\\s\\x1c-\\x1f{_PUNCTUATION}]+"
FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "processor_config.json", "README.md")
REMOTE_FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "README.md")  # and code


@dataclass(frozen=True)
class Departure:
    reason: str  # what the model computes that transformers' PaliGemma does not
    overrides: tuple[str, ...]  # the `dvc exp run -S` overrides that train a model without it


def departures(config: VLMConfig) -> list[Departure]:
    """Everything in ``config`` that transformers' PaliGemma does not compute, each with the params that train a
    model without it; none: the model exports. A model option that changes the computation adds its line here."""
    perception = config.perception
    perception_off = (*(f"model.perception.heads.{name}=0" for name in perception.active_heads),
                      *(["model.perception.to_decoder=false"] if perception.to_decoder else []),
                      *(["model.perception.label_maps_in_training=false"] if perception.label_maps_in_training else []),
                      *(["model.perception.stem_channels=[]"] if perception.stem_channels else []),
                      *(["model.perception.mirror_average=false"] if perception.mirror_average else []),
                      *(["model.perception.oracle=false"] if perception.oracle else []))
    if config.vision != "siglip":  # no training run makes the baseline one: nothing else to name
        return [Departure("it is the text-only baseline (model.vision: none), which reads no image; export the VLM "
                          "(models/vlm.pt) instead", ())]
    found = [
        (perception.enabled, "the traffic perception is on (model.perception: conv stem and heads)", perception_off),
        (config.connector != "linear", f"its connector is {config.connector!r} (PaliGemma's is linear)",
         ("model.connector=linear",)),
        (config.pixel_shuffle != 1, f"model.pixel_shuffle is {config.pixel_shuffle} (PaliGemma's projector reads "
                                    f"one patch per image token)", ("model.pixel_shuffle=1",)),
        (config.pack_questions, "model.pack_questions is on (its image tokens ignore the question; PaliGemma's "
                                "attend to the whole prefix)", ("model.pack_questions=false",)),
        (config.mirror_answers, "model.mirror_answers is on (its answers are the mean over the image and its mirror "
                                "image; transformers' PaliGemma asks once)", ("model.mirror_answers=false",)),
        (len(set(config.siglip.height_width)) > 1, "its images are {} x {} px (H x W; transformers' SigLIP is "
         "square)".format(*config.siglip.height_width), ("pack.aspect=square",)),
    ]
    return [Departure(reason, overrides) for departs, reason, overrides in found if departs]


def check_exportable(config: VLMConfig, source: str | Path) -> None:
    """A one-line ``ValueError`` naming each of :func:`departures` and the ``dvc exp run`` training one that exports."""
    found = departures(config)
    if not found:
        return
    message = f"{source}: cannot be exported as transformers' PaliGemma: " + "; ".join(d.reason for d in found)
    overrides = [o for d in found for o in d.overrides]
    if overrides:
        message += ". Train one that can with: dvc exp run " + " ".join(f"-S {shlex.quote(o)}" for o in overrides)
    raise ValueError(message)


def check_answers_from_images(config: VLMConfig, source: str | Path) -> None:
    """Refuse, in one line, a model whose answers need more than an image and a question to export with its code."""
    if config.vision == "none":
        raise ValueError(f"{source}: {departures(config)[0].reason}")
    if config.perception.oracle:
        raise ValueError(f"{source}: its decoder reads the label maps (model.perception.oracle, a probe), which an "
                         f"image alone does not give; export a model trained without it")


def hf_config(config: VLMConfig) -> dict[str, Any]:
    """config.json: transformers' ``PaliGemmaConfig`` of the model."""
    siglip, gemma = config.siglip, config.gemma
    token_ids = {"bos_token_id": SOS, "eos_token_id": EOS, "pad_token_id": PAD}
    return {
        "architectures": ["PaliGemmaForConditionalGeneration"], "model_type": "paligemma",
        "image_token_index": IMAGE_TOKEN_ID, "vocab_size": gemma.vocab_size, "hidden_size": gemma.hidden_size,
        "projection_dim": gemma.hidden_size, "tie_word_embeddings": True, "dtype": "float32", **token_ids,
        "vision_config": {
            "model_type": "siglip_vision_model", "hidden_size": siglip.hidden_size,
            "intermediate_size": siglip.intermediate_size, "num_hidden_layers": siglip.num_hidden_layers,
            "num_attention_heads": siglip.num_attention_heads, "num_channels": siglip.num_channels,
            "image_size": siglip.image_size, "patch_size": siglip.patch_size,
            "layer_norm_eps": siglip.layer_norm_eps, "hidden_act": "gelu_pytorch_tanh", "vision_use_head": False,
            "projection_dim": gemma.hidden_size,
        },
        "text_config": {
            "model_type": "gemma", "vocab_size": gemma.vocab_size, "hidden_size": gemma.hidden_size,
            "intermediate_size": gemma.intermediate_size, "num_hidden_layers": gemma.num_hidden_layers,
            "num_attention_heads": gemma.num_attention_heads, "num_key_value_heads": gemma.num_key_value_heads,
            "head_dim": gemma.head_dim, "rms_norm_eps": gemma.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": gemma.rope_theta},
            "hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": True, **token_ids,
        },
    }


def hf_tokenizer(vocab: Mapping[str, int]) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` of ``vocab``: our words, "yes"/"no"/"maybe" the ids of [YES]/[NO]/[MAYBE], a line
    break [SEP], special tokens matched only as written; alone it encodes a question as ``encode_question`` does."""
    words = {token: i for token, i in vocab.items() if i >= FIRST_WORD_ID and token not in ANSWER_TOKEN_WORDS}
    table = {name: i for i, name in SPECIAL.items()} | ANSWER_TOKEN_WORDS | words
    tokenizer = Tokenizer(models.WordLevel(table, unk_token=SPECIAL[UNK]))
    tokenizer.normalizer = normalizers.Sequence([
        normalizers.NFKC(), normalizers.Lowercase(), normalizers.Replace("\n", f" {SPECIAL[SEP]} ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(TOKEN_PATTERN), behavior="removed", invert=True)
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in SPECIAL.values()])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL[SOS]} $A {SPECIAL[SEP]}", special_tokens=[(SPECIAL[SOS], SOS), (SPECIAL[SEP], SEP)])
    return tokenizer


def tokenizer_config() -> dict[str, Any]:
    """tokenizer_config.json: the special tokens by role; left padding, as batched ``generate`` needs."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "processor_class": "PaliGemmaProcessor",
            "bos_token": SPECIAL[SOS], "eos_token": SPECIAL[EOS], "pad_token": SPECIAL[PAD],
            "unk_token": SPECIAL[UNK], "sep_token": SPECIAL[SEP], "image_token": IMAGE_TOKEN,
            "padding_side": "left", "clean_up_tokenization_spaces": True}


def processor_config(loaded: LoadedModel) -> dict[str, Any]:
    """processor_config.json: SigLIP's image processor squashing to the packed size, filter and mean/std of packing."""
    config, side = loaded.model.config, loaded.image_size
    return {
        "processor_class": "PaliGemmaProcessor", "image_processor": {
            "image_processor_type": "SiglipImageProcessor", "image_seq_length": loaded.model.num_image_tokens,
            "do_convert_rgb": True, "do_resize": True, "size": {"height": side, "width": side},
            "resample": int(RESAMPLE[loaded.resample]), "do_rescale": True, "rescale_factor": 1 / 255,
            "do_normalize": True, "image_mean": config.image_mean, "image_std": config.image_std,
        },
    }


def generation_config(loaded: LoadedModel) -> dict[str, Any]:
    """generation_config.json: greedy decoding that stops at [EOS], at most the longest answer's tokens."""
    return {"bos_token_id": SOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False,
            "max_new_tokens": max(len(ids) for ids in loaded.candidates())}


def remote_config(loaded: LoadedModel) -> dict[str, Any]:
    """config.json of the remote-code export (vlm/hub/configuration_traffic_vlm.py): the model's config, its answers
    and their token ids, each template's phrasings and answers, and how an image file becomes its pixels."""
    templates = [{"id": t.id, "patterns": [p.pattern for p in t.loose_patterns], "phrasings": list(t.phrasings),
                  "answers": list(t.answers)} for t in TEMPLATES.values()]
    image = {"height": loaded.image_size, "width": loaded.image_width, "resample": loaded.resample,
             "aspect": loaded.processor.aspect}
    return {"architectures": ["TrafficVLMForQuestionAnswering"], "model_type": "traffic_vlm",
            "auto_map": {"AutoConfig": "configuration_traffic_vlm.TrafficVLMConfig",
                         "AutoModel": "modeling_traffic_vlm.TrafficVLMForQuestionAnswering"},
            "vlm": loaded.model.config.to_dict(), "answers": loaded.answers, "candidates": loaded.candidates(),
            "templates": templates, "image": image, "bos_token_id": SOS, "eos_token_id": EOS, "pad_token_id": PAD,
            "tie_word_embeddings": True, "dtype": "float32"}


def model_card(loaded: LoadedModel, source: str, folder: str, template: str = "model_card.md") -> str:
    """README.md (text: vlm/templates/``template``): the training data, sizes, params, metrics, how to ask it."""
    config, payload = loaded.model.config, loaded.checkpoint
    statistics = payload["vocab"].get("statistics", {})
    metrics = "\n".join(f"| {key} | {_number(value)} |" for key, value in payload.get("metrics", {}).items())
    started = [f"the {part} from `{path}`" for part, path in (("encoder", config.vision_checkpoint),
                                                               ("decoder", config.decoder_checkpoint)) if path]
    text = resources.files("vlm").joinpath("templates", template).read_text(encoding="utf-8")
    return text.format(
        start="starting " + " and ".join(started) if started else "from scratch", source=source, folder=folder,
        questions=statistics.get("num_commands", "?"), coverage=statistics.get("coverage_pct", "?"),
        num_answers=len(loaded.answers), answers=", ".join(loaded.answers), loaded=loaded, config=config,
        mean=_numbers(config.image_mean), std=_numbers(config.image_std), siglip=config.siglip, gemma=config.gemma,
        parameters=sum(p.numel() for p in loaded.model.parameters()),  # the tied LM head once
        config_json=json.dumps(config.to_dict(), indent=2), metrics=metrics,
        width=loaded.image_width or loaded.image_size, reasons="; ".join(d.reason for d in departures(config)))


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _numbers(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


def export(checkpoint: str | Path, out: str | Path, plain: bool = False) -> Path:
    """Write the transformers folder of the model ``checkpoint`` at ``out`` (whole or not at all) and return it:
    PaliGemma's (:data:`FILES`) for the plain design, else one with the model's code (``--plain``: refused). ``out``
    may be a new folder or an earlier export (replaced); a folder holding anything else is refused."""
    out = Path(out)
    code = vendor.sources()
    if out.exists() and not (out.is_dir() and {p.name for p in out.iterdir()} <= {*FILES, *REMOTE_FILES, *code}):
        raise FileExistsError(f"--out {out}: exists and is not an earlier export (which holds only "
                              f"{', '.join(FILES)}, or {', '.join(REMOTE_FILES)} and the model's code); give a new "
                              f"folder")
    loaded = load_model(checkpoint)
    if plain:
        check_exportable(loaded.model.config, checkpoint)
    remote = bool(departures(loaded.model.config))
    if remote:
        check_answers_from_images(loaded.model.config, checkpoint)
    state = {("vlm." if remote else "") + key: tensor.contiguous() for key, tensor in loaded.model.state_dict().items()
             if key != "language_model.lm_head.weight"}  # tied to language_model.model.embed_tokens
    if remote:
        texts = {"config.json": remote_config(loaded), "tokenizer_config.json": tokenizer_config()}
        card = model_card(loaded, str(checkpoint), str(out), "remote_model_card.md")
    else:
        texts = {"config.json": hf_config(loaded.model.config), "generation_config.json": generation_config(loaded),
                 "tokenizer_config.json": tokenizer_config(), "processor_config.json": processor_config(loaded)}
        card, code = model_card(loaded, str(checkpoint), str(out)), {}
    with atomic_path(out) as tmp:
        tmp.mkdir()
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        for name, content in texts.items():
            (tmp / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
        for name, text in code.items():
            (tmp / name).write_text(text, encoding="utf-8")
        hf_tokenizer(loaded.tokenizer.vocab).save(str(tmp / "tokenizer.json"))
        (tmp / "README.md").write_text(card, encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vlm.export", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="models/vlm.pt", help="the trained model (vlm/checkpoint.py)")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (new, or an earlier export)")
    parser.add_argument("--plain", action="store_true",
                        help="refuse a model transformers' PaliGemma does not compute, instead of exporting its code")
    args = parser.parse_args(argv)
    print(f"wrote {export(args.checkpoint, args.out, args.plain)}")


if __name__ == "__main__":
    run(main)
