"""Ask a trained model about any image.

Images of any size and format are preprocessed exactly as in training; the answer is constrained decoding over the
answers its question's template can give, printed with its probability (usage: README). Unknown words become [UNK],
with a warning; a question of no template is answered over every answer, with a warning naming the closest."""

import argparse
import logging

import numpy as np

from vlm.checkpoint import LoadedModel, load_model
from vlm.cli import run
from vlm.commands.templates import closest_phrasings, fitting_answers, match_template
from vlm.device import pick_device
from vlm.inference import answer_questions, constrain

logger = logging.getLogger(__name__)
BATCH = 64  # images decoded and answered together: a long list of --image files is read a batch at a time


def check_question(loaded: LoadedModel, question: str) -> None:
    """Refuse a question the model cannot read: no words at all, or none it was trained on."""
    words = [t for t in loaded.tokenizer.tokenize(question) if any(ch.isalnum() for ch in t)]
    if not words:
        raise ValueError(f"--question {question!r}: has no words; ask e.g. \"Is there a pedestrian?\"")
    vocab = loaded.tokenizer.vocab
    if not any(w in vocab for w in words):
        raise ValueError(f"--question {question!r}: none of its words ({', '.join(words)}) is in the model's "
                         f"vocabulary; the model was trained on questions like \"Is there a pedestrian?\"")


def question_template(question: str) -> str | None:
    """The id of the template ``question`` is a phrasing of, whose answers alone are scored; None (every answer
    scored) with a warning naming the closest phrasings."""
    template = match_template(question)
    if template is None:
        closest = "; ".join(f'"{p}"' for p in closest_phrasings(question))
        logger.warning("--question %r is no phrasing the model was trained on, so every answer is scored; the "
                       "closest: %s", question, closest)
        return None
    return template.id


def answer_images(loaded: LoadedModel, image_paths: list[str], question: str) -> list[list[tuple[str, float]]]:
    """For each image, the answers the question's template can give, each with its probability, most probable
    first (every answer for a question of no template)."""
    check_question(loaded, question)
    template = question_template(question)
    processor = loaded.processor
    images = {path: processor.image(path) for path in image_paths}  # uint8 [3, H, W] each
    device = next(loaded.model.parameters()).device
    probs = answer_questions(loaded.model, processor, images, [(path, question) for path in image_paths],
                             loaded.candidates(), batch_size=len(image_paths), device=device)  # [N, C]
    fitting = fitting_answers([template] * len(image_paths), loaded.answers)  # [N, C]
    probs = constrain(probs, fitting)
    return [[(loaded.answers[i], float(row[i])) for i in np.argsort(-row, kind="stable") if fits[i]]
            for row, fits in zip(probs, fitting)]


def at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vlm.predict", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="models/vlm.pt")
    parser.add_argument("--image", nargs="+", required=True, help="image file(s), any size and format")
    parser.add_argument("--question", required=True)
    parser.add_argument("--vocab", default=None, help="check that this vocab.json is the model's")
    parser.add_argument("--top", type=at_least_one, default=1,
                        help="how many of the most probable answers to print (default 1)")
    args = parser.parse_args(argv)
    loaded = load_model(args.checkpoint, args.vocab, pick_device())
    if loaded.model.config.vision == "none":
        logger.warning("%s is the text-only baseline: it answers from the question alone, whatever the image",
                       args.checkpoint)
    for start in range(0, len(args.image), BATCH):
        paths = args.image[start:start + BATCH]
        for path, ranked in zip(paths, answer_images(loaded, paths, args.question)):
            best, p = ranked[0]
            others = ", ".join(f"{a} {q:.1%}" for a, q in ranked[1:args.top])
            print(f"{path}: {best} ({p:.1%})" + (f"  [{others}]" if others else ""), flush=True)


if __name__ == "__main__":
    run(main)
