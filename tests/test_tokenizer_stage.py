"""stages/build_vocab.py on temporary folders: outputs, determinism, and errors before any work."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_tokenizer import realistic_commands
from vlm.config import ParamError
from vlm.tokenizer import TrafficCommandTokenizer

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "stages" / "build_vocab.py"


def _load_stage():
    spec = importlib.util.spec_from_file_location("build_vocab_stage", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_vocab_stage = _load_stage()


@pytest.fixture()
def workdir(tmp_path) -> Path:
    commands = tmp_path / "commands"
    commands.mkdir()
    for seed, (split, n) in enumerate((("train", 1500), ("val", 300), ("test", 300))):
        (commands / f"{split}.json").write_text(json.dumps(realistic_commands(n, seed)))
    (tmp_path / "params.yaml").write_text("vocab:\n  min_freq: 1\n  max_vocab_size: 1000\n  max_length: 32\n")
    return tmp_path


def _args(d: Path, out: str = "vocab.json", metrics: str = "metrics/vocab.json") -> list[str]:
    return ["--params", str(d / "params.yaml"), "--commands-dir", str(d / "commands"),
            "--out", str(d / out), "--metrics", str(d / metrics)]


def test_stage_writes_vocab_and_metrics_deterministically(workdir, capsys):
    build_vocab_stage.main(_args(workdir))
    tokenizer = TrafficCommandTokenizer.from_file(workdir / "vocab.json")
    metrics = json.loads((workdir / "metrics" / "vocab.json").read_text())
    assert metrics["vocab_size"] == tokenizer.vocab_size
    assert list(metrics) == ["vocab_size", "num_words", "train", "val", "test"]
    assert metrics["train"]["coverage_pct"] == 100.0
    for split in ("val", "test"):
        assert metrics[split]["coverage_pct"] >= 99.0
        assert metrics[split]["tokens"] > 0
    assert "val: coverage" in capsys.readouterr().out

    # Built from train only: changing val changes the metrics, never the vocabulary.
    (workdir / "commands" / "val.json").write_text(json.dumps([{"command": "Is there a zebra?", "answer": "no"}]))
    build_vocab_stage.main(_args(workdir, out="vocab2.json", metrics="metrics2.json"))
    assert (workdir / "vocab2.json").read_bytes() == (workdir / "vocab.json").read_bytes()
    metrics2 = json.loads((workdir / "metrics2.json").read_text())
    assert (metrics2["val"]["oov_tokens"], metrics2["val"]["oov_unique"]) == (1, 1)


def test_stage_rejects_bad_params_before_reading_commands(workdir):
    (workdir / "commands" / "train.json").unlink()  # would be the next error
    (workdir / "params.yaml").write_text("vocab:\n  min_freq: 1\n  max_vocab_sise: 1000\n")
    with pytest.raises(ParamError, match="vocab.max_vocab_sise: unknown key"):
        build_vocab_stage.main(_args(workdir))
    (workdir / "params.yaml").write_text("vocab:\n  min_freq: one\n")
    with pytest.raises(ParamError, match="vocab.min_freq: must be an integer"):
        build_vocab_stage.main(_args(workdir))
    assert not (workdir / "vocab.json").exists()


def test_stage_names_missing_or_malformed_split(workdir):
    (workdir / "commands" / "test.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"commands file not found: .*test\.json"):
        build_vocab_stage.main(_args(workdir))
    (workdir / "commands" / "test.json").write_text(json.dumps([{"command": "Is it night?", "answer": 1}]))
    with pytest.raises(ValueError, match=r"test\.json: record 0 field 'answer' must be a non-empty string"):
        build_vocab_stage.main(_args(workdir))
    assert not (workdir / "vocab.json").exists() and not (workdir / "metrics").exists()


def test_stage_runs_as_a_script_without_torch(workdir):
    """Building the vocabulary is text work: the stage never imports torch (two seconds of each run's start)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    script = (f"import runpy, sys; sys.argv = {[str(SCRIPT), *_args(workdir)]!r}; "
              f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__'); print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=workdir,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "False", result.stdout
    assert (workdir / "vocab.json").is_file() and (workdir / "metrics" / "vocab.json").is_file()
