"""Ask a trained model about any image.

Images of any size and format are preprocessed exactly as in training; the answer is constrained decoding over the
model's answer set, printed with its probability (usage: README). Unknown words become [UNK], with a warning."""

import argparse

import numpy as np

from vlm.checkpoint import LoadedModel, load_model
from vlm.cli import run
from vlm.device import pick_device
from vlm.inference import answer_questions


def check_question(loaded: LoadedModel, question: str) -> None:
    """Refuse a question the model cannot read: no words at all, or none it was trained on."""
    words = [t for t in loaded.tokenizer.tokenize(question) if any(ch.isalnum() for ch in t)]
    if not words:
        raise ValueError(f"--question {question!r}: has no words; ask e.g. \"Is there a pedestrian?\"")
    vocab = loaded.tokenizer.vocab
    if not any(w in vocab for w in words):
        raise ValueError(f"--question {question!r}: none of its words ({', '.join(words)}) is in the model's "
                         f"vocabulary; the model was trained on questions like \"Is there a pedestrian?\"")


def answer_images(loaded: LoadedModel, image_paths: list[str], question: str) -> list[list[tuple[str, float]]]:
    """For each image, every answer with its probability, most probable first."""
    check_question(loaded, question)
    processor = loaded.processor
    images = {path: processor.image(path) for path in image_paths}  # uint8 [3, H, W] each
    device = next(loaded.model.parameters()).device
    probs = answer_questions(loaded.model, processor, images, [(path, question) for path in image_paths],
                             loaded.candidates(), batch_size=len(image_paths), device=device)  # [N, C]
    return [[(loaded.answers[i], float(row[i])) for i in np.argsort(-row, kind="stable")] for row in probs]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vlm.predict", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="models/vlm.pt")
    parser.add_argument("--image", nargs="+", required=True, help="image file(s), any size and format")
    parser.add_argument("--question", required=True)
    parser.add_argument("--vocab", default=None, help="check that this vocab.json is the model's")
    parser.add_argument("--top", type=int, default=1, help="also print the next most probable answers")
    args = parser.parse_args(argv)
    loaded = load_model(args.checkpoint, args.vocab, pick_device())
    for path, ranked in zip(args.image, answer_images(loaded, args.image, args.question)):
        best, p = ranked[0]
        others = ", ".join(f"{a} {q:.1%}" for a, q in ranked[1:args.top])
        print(f"{path}: {best} ({p:.1%})" + (f"  [{others}]" if others else ""))


if __name__ == "__main__":
    run(main)
