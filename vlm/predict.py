"""Ask a trained model about any image.

    python -m vlm.predict --checkpoint models/vlm.pt --image street.jpg --question "Is there a bus?"

Images of any size and format are preprocessed exactly as in training (JPEG draft downscale, squash
to the packed size, the packing's resampling filter); the answer is constrained decoding over the
model's answer set, printed with its probability. Words the model never saw become [UNK], with a
warning naming them.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from vlm.batch import Batch
from vlm.checkpoint import LoadedModel, load_model
from vlm.cli import run
from vlm.data.pack import decode_image


def check_question(loaded: LoadedModel, question: str) -> None:
    """Refuse a question the model cannot read: no words at all, or none it was trained on."""
    words = [t for t in loaded.tokenizer.tokenize(question) if any(ch.isalnum() for ch in t)]
    if not words:
        raise ValueError(f"--question {question!r}: has no words; ask e.g. \"Is there a pedestrian?\"")
    vocab = loaded.tokenizer.vocab
    if not any(w in vocab for w in words):
        raise ValueError(f"--question {question!r}: none of its words ({', '.join(words)}) is in the model's "
                         f"vocabulary; the model was trained on questions like \"Is there a pedestrian?\"")


@torch.no_grad()
def answer_images(loaded: LoadedModel, image_paths: list[str], question: str) -> list[list[tuple[str, float]]]:
    """For each image, every answer with its probability, most probable first."""
    check_question(loaded, question)
    images = np.stack([decode_image(p, loaded.image_size, loaded.resample) for p in image_paths])  # [N, S, S, 3]
    device = next(loaded.model.parameters()).device
    question_ids = torch.tensor(loaded.tokenizer.encode_question(question), device=device)
    n = len(image_paths)
    batch = Batch(images=torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device),  # uint8 [N, 3, S, S]
                  image_index=torch.arange(n, device=device),
                  input_ids=question_ids.expand(n, -1),
                  attention_mask=torch.ones(n, len(question_ids), dtype=torch.long, device=device),
                  prefix_lengths=torch.full((n,), len(question_ids), device=device))
    probs = loaded.model.answer(batch, loaded.candidates())  # [N, C]
    ranked = []
    for row in probs.float().cpu().numpy():
        order = np.argsort(-row, kind="stable")
        ranked.append([(loaded.answers[i], float(row[i])) for i in order])
    return ranked


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vlm.predict", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="models/vlm.pt")
    parser.add_argument("--image", nargs="+", required=True, help="image file(s), any size and format")
    parser.add_argument("--question", required=True)
    parser.add_argument("--vocab", default=None, help="check that this vocab.json is the model's")
    parser.add_argument("--top", type=int, default=1, help="also print the next most probable answers")
    args = parser.parse_args(argv)
    loaded = load_model(args.checkpoint, args.vocab, "cuda" if torch.cuda.is_available() else "cpu")
    for path, ranked in zip(args.image, answer_images(loaded, args.image, args.question)):
        best, p = ranked[0]
        others = ", ".join(f"{a} {q:.1%}" for a, q in ranked[1:args.top])
        print(f"{path}: {best} ({p:.1%})" + (f"  [{others}]" if others else ""))


if __name__ == "__main__":
    run(main)
