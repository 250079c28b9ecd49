"""DVC stage build_vocab: the word vocabulary from the train commands, coverage on every split.

Reads params ``vocab`` and ``data/processed/commands/{train,val,test}.json``; writes
``data/processed/vocab.json`` (built from train only) and ``metrics/vocab.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vlm.cli import run
from vlm.config import build_config
from vlm.data.commands import SPLITS, read_commands
from vlm.io import check_writable, write_json
from vlm.params import load_params, section
from vlm.tokenizer import TrafficCommandTokenizer, VocabConfig, coverage_by_split, vocab_metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--commands-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--metrics", required=True)
    args = parser.parse_args(argv)
    check_writable(args.out, args.metrics)

    config = build_config(VocabConfig, section(load_params(args.params), "vocab"), "vocab")
    splits = {name: read_commands(Path(args.commands_dir) / f"{name}.json", ("command", "answer")) for name in SPLITS}

    tokenizer = TrafficCommandTokenizer.build_vocab(
        splits["train"], config.min_freq, config.max_vocab_size, config.max_length,
        source=str(Path(args.commands_dir) / "train.json"),
    )
    reports = coverage_by_split(tokenizer, splits)
    tokenizer.save_vocab(args.out)
    write_json(args.metrics, vocab_metrics(tokenizer, reports))

    print(f"vocabulary: {tokenizer.vocab_size} ids -> {args.out}")
    for name, report in reports.items():
        top = ", ".join(f"{word} ({count})" for word, count in report.top_oov) or "none"
        print(f"  {name}: coverage {report.coverage_pct:.2f}% of {report.num_tokens} tokens, "
              f"{report.num_oov} OOV ({report.num_unique_oov} unique); top OOV: {top}")


if __name__ == "__main__":
    run(main)
