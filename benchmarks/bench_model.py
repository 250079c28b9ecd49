"""Training throughput of our PaliGemma core against the equivalent transformers PaliGemma, on the CPU.

    PYTHONPATH=. python benchmarks/bench_model.py --out metrics/bench_model.json

Both models get the same sizes (the proposed ``model:`` defaults unless overridden) and the same
weights (ours are copied into PaliGemma, and the two losses are checked to agree), then run
forward + backward on the same batch, interleaved round by round so that machine noise hits both
alike; the medians give questions/s and the ratio ours / transformers (target >= 1.0).

Rows:
- ``train_one_image_per_question``: equal work, every question with its own image;
- ``train_shared_images``: the usual batch, ``--questions-per-image`` questions per image; ours
  encodes each distinct image once, PaliGemma (which has no such path) encodes one copy per question;
- ``answer_packed_vs_per_candidate`` and ``generate_cache_vs_none``: inference paths of ours against
  their straightforward alternatives (one forward per candidate answer; recomputing the whole
  sequence at every generated token).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import time

import torch

from vlm.batch import IGNORE_INDEX, Batch
from vlm.io import write_json
from vlm.models.gemma import GemmaConfig
from vlm.models.paligemma import PaliGemma, PaliGemmaConfig
from vlm.models.siglip import SiglipVisionConfig

SOS, EOS, SEP, YES, NO, MAYBE = 2, 3, 7, 4, 5, 6


def make_batch(config: PaliGemmaConfig, batch: int, questions_per_image: int, seed: int = 0) -> Batch:
    """Right-padded [SOS] question(6-12 words) [SEP] answer [EOS] rows, as the collate function builds them."""
    g = torch.Generator().manual_seed(seed)
    size, vocab = config.siglip.image_size, config.gemma.vocab_size
    num_images = -(-batch // questions_per_image)
    rows, prefix_lengths = [], []
    for b in range(batch):
        question = [SOS] + torch.randint(10, vocab, (6 + b % 7,), generator=g).tolist() + [SEP]
        answer = [[YES], [NO], [MAYBE], torch.randint(10, vocab, (1,), generator=g).tolist()][b % 4] + [EOS]
        rows.append(question + answer)
        prefix_lengths.append(len(question))
    length = max(map(len, rows))
    input_ids = torch.zeros(batch, length, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    for b, ids in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention_mask[b, : len(ids)] = 1
        labels[b, prefix_lengths[b]: len(ids)] = input_ids[b, prefix_lengths[b]: len(ids)]
    return Batch(images=torch.randint(0, 256, (num_images, 3, size, size), dtype=torch.uint8, generator=g),
                 image_index=torch.arange(batch) // questions_per_image, input_ids=input_ids,
                 attention_mask=attention_mask, prefix_lengths=torch.tensor(prefix_lengths), labels=labels)


def paligemma_like(ours: PaliGemma):
    """transformers PaliGemma with our sizes and our weights."""
    import transformers

    vision, text = ours.config.siglip, ours.config.gemma
    config = transformers.PaliGemmaConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=vision.hidden_size,
                           intermediate_size=vision.intermediate_size, num_hidden_layers=vision.num_hidden_layers,
                           num_attention_heads=vision.num_attention_heads, image_size=vision.image_size,
                           patch_size=vision.patch_size, layer_norm_eps=vision.layer_norm_eps, vision_use_head=False),
        text_config=dict(model_type="gemma", vocab_size=text.vocab_size, hidden_size=text.hidden_size,
                         intermediate_size=text.intermediate_size, num_hidden_layers=text.num_hidden_layers,
                         num_attention_heads=text.num_attention_heads, num_key_value_heads=text.num_key_value_heads,
                         head_dim=text.head_dim, rms_norm_eps=text.rms_norm_eps,
                         rope_parameters={"rope_type": "default", "rope_theta": text.rope_theta}),
        image_token_index=text.vocab_size, projection_dim=text.hidden_size)
    theirs = transformers.PaliGemmaForConditionalGeneration(config)
    renamed = {}
    for key, value in ours.state_dict().items():
        if key.startswith("language_model.model."):
            renamed["model.language_model." + key.removeprefix("language_model.model.")] = value
        elif key == "language_model.lm_head.weight":
            renamed["lm_head.weight"] = value
        else:
            renamed["model." + key] = value
    theirs.load_state_dict(renamed, strict=True)
    return theirs


def paligemma_inputs(ours: PaliGemma, batch: Batch) -> dict:
    """The same batch in PaliGemma's terms: one normalised image per question, image placeholder tokens,
    token_type_ids 0 on the prefix (bidirectional) and 1 on the answer, labels -100 on the image tokens."""
    config = ours.config
    tokens, (size, length) = ours.num_image_tokens, batch.input_ids.shape
    mean = torch.tensor(config.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(config.image_std).view(1, 3, 1, 1)
    answer_part = (torch.arange(length) >= batch.prefix_lengths[:, None]).long()
    return {
        "pixel_values": (batch.images[batch.image_index].float() / 255 - mean) / std,
        "input_ids": torch.cat([torch.full((size, tokens), config.gemma.vocab_size), batch.input_ids], 1),
        "attention_mask": torch.cat([torch.ones(size, tokens, dtype=torch.long), batch.attention_mask], 1),
        "token_type_ids": torch.cat([torch.zeros(size, tokens, dtype=torch.long), answer_part], 1),
        "labels": torch.cat([torch.full((size, tokens), IGNORE_INDEX), batch.labels], 1),
    }


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(fns: dict, rounds: int, warmup: int) -> dict[str, float]:
    """Median seconds per call of each function, calls interleaved (order alternating every round)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            times[name].append(seconds(fns[name]))
    return {name: statistics.median(t) for name, t in times.items()}


def train_step(model, inputs: Batch | dict):
    """One forward + backward: ours takes a Batch, transformers keyword arguments."""
    def step():
        model.zero_grad(set_to_none=True)
        (model(**inputs).loss if isinstance(inputs, dict) else model(inputs).losses["answer"]).backward()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--batch", type=int, default=32, help="questions per batch")
    parser.add_argument("--questions-per-image", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=160)
    parser.add_argument("--patch-size", type=int, default=SiglipVisionConfig.patch_size)
    # encoder and decoder alike (the proposed model: defaults); small values for a smoke test
    parser.add_argument("--hidden-size", type=int, default=GemmaConfig.hidden_size)
    parser.add_argument("--intermediate-size", type=int, default=GemmaConfig.intermediate_size)
    parser.add_argument("--layers", type=int, default=GemmaConfig.num_hidden_layers)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    sizes = dict(hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
                 num_hidden_layers=args.layers)
    config = PaliGemmaConfig(siglip=SiglipVisionConfig(image_size=args.image_size, patch_size=args.patch_size, **sizes),
                       gemma=GemmaConfig(vocab_size=args.vocab_size, **sizes))
    ours = PaliGemma(config).train()
    theirs = paligemma_like(ours).train()
    attn_implementation = theirs.config.text_config._attn_implementation

    one_each = make_batch(config, args.batch, questions_per_image=1)
    shared = make_batch(config, args.batch, questions_per_image=args.questions_per_image)
    with torch.no_grad():  # same weights, same inputs: same loss (else the comparison would be meaningless)
        ours_loss = float(ours(one_each).losses["answer"])
        loss_gap = abs(ours_loss - float(theirs(**paligemma_inputs(ours, one_each)).loss))
    if loss_gap > 1e-4:
        raise SystemExit(f"ours and PaliGemma disagree (loss gap {loss_gap:.2e}); not comparing speed")

    results = {}
    for name, batch in (("train_one_image_per_question", one_each), ("train_shared_images", shared)):
        median = interleaved({"ours": train_step(ours, batch),
                              "transformers": train_step(theirs, paligemma_inputs(ours, batch))},
                             args.rounds, args.warmup)
        results[name] = {"ours_questions_per_s": args.batch / median["ours"],
                         "transformers_questions_per_s": args.batch / median["transformers"],
                         "ratio": median["transformers"] / median["ours"],
                         "images_encoded_ours": int(batch.images.shape[0]),
                         "images_encoded_transformers": args.batch}

    ours.eval()
    prefix = dataclasses.replace(shared, labels=None)
    answers = [[YES, EOS], [NO, EOS], [MAYBE, EOS]] + [[10 + i, EOS] for i in range(13)]  # 3 colours + 10 counts

    def per_candidate():
        for candidate in answers:
            rows = []
            for b in range(args.batch):
                rows.append(shared.input_ids[b, : int(shared.prefix_lengths[b])].tolist() + candidate)
            length = max(map(len, rows))
            ids = torch.zeros(args.batch, length, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for b, r in enumerate(rows):
                ids[b, : len(r)], mask[b, : len(r)] = torch.tensor(r), 1
            ours(Batch(shared.images, shared.image_index, ids, mask, shared.prefix_lengths))

    with torch.no_grad():
        median = interleaved({"ours": lambda: ours.answer(prefix, candidates=answers), "baseline": per_candidate},
                             max(3, args.rounds // 2), 1)
        results["answer_packed_vs_per_candidate"] = {"candidates": len(answers), "ours_s": median["ours"],
                                                     "baseline_s": median["baseline"],
                                                     "ratio": median["baseline"] / median["ours"]}
        median = interleaved({"ours": lambda: ours.generate(prefix, eos_token_id=-1, max_new_tokens=4),
                              "baseline": lambda: ours.generate(prefix, eos_token_id=-1, max_new_tokens=4,
                                                                use_cache=False)},
                             max(3, args.rounds // 2), 1)
        results["generate_cache_vs_none"] = {"new_tokens": 4, "ours_s": median["ours"],
                                             "baseline_s": median["baseline"],
                                             "ratio": median["baseline"] / median["ours"]}

    report = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                    "torch": torch.__version__, "transformers_attention": attn_implementation},
        "setup": {"batch": args.batch, "questions_per_image": args.questions_per_image,
                  "text_length": int(one_each.input_ids.shape[1]), "image_tokens": ours.num_image_tokens,
                  "model": config.to_dict(), "loss_gap": loss_gap, "rounds": args.rounds},
        "results": results,
    }
    print(f"{'benchmark':34} {'ours':>12} {'baseline':>12} {'ratio':>7}")
    for name, row in results.items():
        if name.startswith("train"):
            print(f"{name:34} {row['ours_questions_per_s']:9.1f} q/s {row['transformers_questions_per_s']:9.1f} q/s "
                  f"{row['ratio']:7.2f}")
        else:
            print(f"{name:34} {row['ours_s'] * 1e3:10.1f} ms {row['baseline_s'] * 1e3:10.1f} ms {row['ratio']:7.2f}")
    print("ratio = baseline time / our time (> 1: ours faster); training baseline: transformers PaliGemma "
          f"({attn_implementation} attention)")
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()
