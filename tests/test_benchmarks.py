"""Smoke tests of the benchmark scripts (`make bench`): each runs as `make bench` runs it, on tiny settings,
and writes the JSON report the README's speed numbers come from."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from PIL import Image

from tiny_project import FRAME_SIZE, TINY_MODEL, TINY_RUNTIME, paths_for, tiny_train_config
from vlm.data.h5file import PackedImageReader
from vlm.train import train

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(name: str, out: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args, "--out", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text())


def test_bench_tokenizer(tmp_path):
    report = run_benchmark("bench_tokenizer.py", tmp_path / "tokenizer.json", "--n", "200", "--repeats", "1")
    assert report["num_commands"] == 200
    names = {"batch_encode", "batch_encode_cold_cache", "textbook", "batch_encode_no_cache"}
    assert set(report["commands_per_s"]) == set(report["speedup_vs_textbook"]) == names
    assert {"distinct_commands", "source", "collate_batch_64_us"} <= set(report)


def test_bench_model(tmp_path):
    pytest.importorskip("transformers", reason="the baseline is transformers' PaliGemma (test extra)")
    report = run_benchmark("bench_model.py", tmp_path / "model.json", "--batch", "4", "--rounds", "1",
                           "--warmup", "0", "--image-size", "32", "--patch-size", "8", "--hidden-size", "48",
                           "--intermediate-size", "64", "--layers", "1", "--vocab-size", "40", "--threads", "1")
    assert set(report) == {"machine", "setup", "results"}
    assert report["setup"]["loss_gap"] <= 1e-4
    assert report["setup"]["model"]["gemma"]["hidden_size"] == 48
    results = report["results"]
    for name in ("train_one_image_per_question", "train_shared_images"):
        assert set(results[name]) == {"ours_questions_per_s", "transformers_questions_per_s", "ratio",
                                      "images_encoded_ours", "images_encoded_transformers"}
    assert results["train_shared_images"]["images_encoded_ours"] == 1  # 4 questions of one image
    for name in ("answer_packed_vs_per_candidate", "generate_cache_vs_none"):
        assert {"ours_s", "baseline_s", "ratio"} <= set(results[name])


def test_bench_loader(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (72, 128, 3), dtype=np.uint8)).save(images / f"{i}.jpg")
    report = run_benchmark("bench_loader.py", tmp_path / "pack.json", "--images", str(images), "--sizes", "32",
                           "--workers", "2", "--repeats", "1")
    assert report["images"] == 3 and report["source_size"] == [128, 72]
    # the pack stage's shape: 32 high, 16:9 wide, rounded to params.yaml's patch size x pixel_shuffle (32)
    assert report["aspect"] == "native" and report["image_widths"] == {"32px": 64}
    assert set(report["decode"]["32px"]) == {"bilinear", "bicubic", "lanczos"}
    assert set(report["decode"]["32px"]["bicubic"]) == {"full_decode_cpu_ms_per_image", "draft_cpu_ms_per_image",
                                                        "draft_speedup", "draft_psnr_db_vs_full_decode"}
    assert set(report["pack"]["32px"]) == {"workers1", "workers2"}
    assert set(report["pack"]["32px"]["workers2"]) == {"images_per_s", "main_process_cpu_ms_per_image"}


@pytest.fixture
def tiny_run(tiny_project, tiny_params, tmp_path):
    """The packed data of the shared tiny project and a params.yaml (the tiny params) training on it."""
    tiny_params["runtime"]["train"]["in_memory"] = True
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params))
    return ["--params", str(tmp_path / "params.yaml"), "--data", str(tiny_project.processed)]


@pytest.mark.xdist_group("tiny_project")  # the worker that builds the shared tiny project
def test_bench_train_step(tmp_path, tiny_run):
    report = run_benchmark("bench_train_step.py", tmp_path / "step.json", *tiny_run, "--warmup", "1", "--steps", "2",
                           "--profile-steps", "2")
    rows = {row["part"]: row for row in report["profile"]["rows"]}
    for part in ("vision: conv stem", "vision: encoder layers", "heads: stride-4 map", "heads: centre head",
                 "heads: counts head", "heads: grounding head", "connector", "decoder layers"):
        assert rows[part]["forward_ms"] > 0 and rows[part]["backward_ms"] > 0, part
    assert rows["data (loader, targets, to device)"]["ms"] > 0 and rows["optimizer (clip, step, schedule)"]["ms"] > 0
    assert abs(sum(row["share"] for row in rows.values()) - 1) < 1e-3
    # forward and backward: each matmul's and convolution's backward is two of its size (weights' and inputs'
    # gradients), less the first layer's input gradient: about 3x the forward, and never more
    ratio = report["train_gflops_per_question"] / report["forward_gflops_per_question"]
    assert 2.5 < ratio <= 3.0 + 1e-3, ratio
    assert report["questions_per_s"] > 0 and 0 < report["mfu"] < 1
    assert report["profile"]["top_operators"]
    operators = report["operators_per_step"]
    assert operators["forward_backward"] > operators["optimizer"] > operators["bookkeeping"] > 0
    assert operators["total"] == sum(operators[phase] for phase in ("forward_backward", "bookkeeping", "optimizer"))
    assert operators["device_reads"] == 2  # the answers' length, the step's record (a row per question: no layout)


def test_gpu_wheels_are_dvc_and_what_it_needs_beyond_the_gpu_image():
    from importlib import metadata

    from benchmarks.gpu_wheels import IMAGE, needed

    packages = needed()
    assert {"dvc", "dvclive", "dvc-data", "scmrepo", "hydra-core"} <= set(packages)
    assert {"torch", "numpy", "pyyaml", "h5py"} <= IMAGE and not set(packages) & IMAGE  # there already
    assert packages["dvc"] == metadata.version("dvc") and packages["dvclive"] == metadata.version("dvclive")


def test_operator_count_counts_what_a_gpu_would_read_back():
    from benchmarks.bench_train_step import OperatorCount

    x, mask, index = torch.arange(6.0), torch.tensor([True, False] * 3), torch.tensor([0, 2])
    counter, tolist = OperatorCount(), torch.Tensor.tolist
    with counter:
        counter.phase = "reads"
        x[mask], x.sum().item(), x.tolist(), mask.nonzero()  # four reads
        counter.phase = "none"
        x[index], x * 2, torch.ones(3, device=x.device)  # sizes known without reading the device
    assert counter.reads == {"reads": 4} and counter.counts["none"] == 3
    assert torch.Tensor.tolist is tolist  # counted under the mode only
    with pytest.raises(RuntimeError, match="already counting"), counter, counter:
        pass
    assert torch.Tensor.tolist is tolist


@pytest.mark.xdist_group("tiny_project")
def test_bench_train_step_compare(tmp_path, tiny_run):
    # the first undoes two changes, through all of them; the next two change the optimizer; the last the arithmetic
    tweaks = ("before_answer_only_and_fused", "channels_last", "per_matrix_muon", "adamw", "cpu_bf16")
    report = run_benchmark("bench_train_step.py", tmp_path / "tweaks.json", *tiny_run, "--compare", *tweaks,
                           "--rounds", "2", "--round-steps", "1", "--check-steps", "3", "--profile-steps", "1")
    results = report["results"]
    assert set(results) == {"baseline", *tweaks}
    assert results["baseline"]["speedup"] == 1 and results["baseline"]["loss_max_abs_diff"] == 0
    assert results["baseline"]["decoder_speedup"] == 1
    for name in tweaks:
        assert results[name]["speedup"] > 0 and results[name]["decoder_ms_per_question"] > 0
        if name not in ("adamw", "cpu_bf16"):  # another optimizer, or bf16: other losses
            assert results[name]["loss_max_abs_diff"] < 1e-2
    # the optimizers' operators: torch.optim.Muon's loop over the matrices, FlatMuon's stacks, fused AdamW alone
    operators = {name: results[name]["operators_per_step"] for name in ("baseline", "per_matrix_muon", "adamw")}
    optimizer = {name: ops["optimizer"] for name, ops in operators.items()}
    assert optimizer["per_matrix_muon"] > optimizer["baseline"] > optimizer["adamw"] > 0
    assert len({ops["forward_backward"] for ops in operators.values()}) == 1
    assert 0 < results["per_matrix_muon"]["loss_max_abs_diff"] < 1e-2  # torch's Muon in bf16, ours in float32


@pytest.mark.xdist_group("tiny_project")
def test_bench_train_step_against_another_design(tmp_path, tiny_run):
    """--against: the baseline is another params file's run; the ratio of whole trainings counts each one's steps
    (here beside the breakdown; with --compare alone)."""
    longer = yaml.safe_load(open(tiny_run[1], encoding="utf-8"))
    longer["train"]["epochs"] *= 2
    (tmp_path / "longer.yaml").write_text(yaml.safe_dump(longer))
    report = run_benchmark("bench_train_step.py", tmp_path / "against.json", "--params", str(tmp_path / "longer.yaml"),
                           "--data", tiny_run[3], "--against", tiny_run[1], tiny_run[3], "--rounds", "2", "--warmup",
                           "1", "--steps", "1", "--round-steps", "1", "--check-steps", "1", "--profile-steps", "1")
    assert report["questions_per_s"] > 0  # the breakdown of --params' run, and beside it the comparison
    assert report["against"]["params"] == tiny_run[1]
    baseline, new = report["against"]["results"]["baseline"], report["against"]["results"]["params"]
    assert new["training_steps"] == 2 * baseline["training_steps"] > 0
    assert new["training_time_ratio"] == pytest.approx(2 / new["speedup"], abs=2e-3)  # speedup is rounded
    assert baseline["training_time_ratio"] == 1


def test_bench_memory(tmp_path):
    report = run_benchmark("bench_memory.py", tmp_path / "memory.json", "--sizes", "30", "36",
                           "--variants", "train (2 ranks, HDF5)", "--image-size", "32", "--extrapolate", "360")
    _, run = report["runs"]
    assert set(report["growth"]) == set(run["stages"])
    assert report["image_size"] == run["image_size"] == 32
    extrapolated = report["extrapolated"]
    assert extrapolated["images"] == 360 and extrapolated["from_images"] == 36
    assert extrapolated["packed_bytes"] == 10 * sum(run["packed_bytes"].values())
    assert extrapolated["train_questions_per_epoch"] == 10 * run["train_questions_per_epoch"] > 0
    assert extrapolated["stage_seconds"]["pack_hdf5"] == round(10 * run["stages"]["pack_hdf5"]["seconds"])
    probe, gpu = run["training_input"], extrapolated["gpu_epoch"]
    assert probe["loader_questions_per_s"] > 0 and probe["train_gflops_per_question"] > 0
    assert gpu["loader_seconds"] == pytest.approx(
        extrapolated["train_questions_per_epoch"] / probe["loader_questions_per_s"], abs=0.05)
    assert gpu["peak_tflops"] == 989.0 and 0 < gpu["arithmetic_seconds_at_peak"] < gpu["loader_seconds"]
    assert run["images"] == 36 and run["raw_bytes"] > 0 and set(run["packed_bytes"]) == {"train", "val", "test"}
    stages = {"generate_scenes", "generate_commands", "build_vocab", "pack_hdf5", "train_blind",
              "train (2 ranks, HDF5)", "evaluate", "counterfactuals"}
    assert set(run["stages"]) == stages
    assert all(r["peak_rss_mib"] > 10 and r["seconds"] > 0 for r in run["stages"].values())
    # stages without torch stay small, also after the first size's runs: no peak of the benchmark's own
    # process leaks into them
    assert run["stages"]["generate_scenes"]["peak_rss_mib"] < 300
    assert run["stages"]["generate_commands"]["peak_rss_mib"] < 300


def test_extrapolation_scales_the_counterfactuals_by_the_scenes_they_edit():
    """Every stage's seconds scale with the images but the counterfactuals', whose test scenes stop at
    counterfactuals.samples: 200 of 1,000 test scenes at 10,000 images are 200 at 100,000 too."""
    from benchmarks.bench_memory import extrapolate

    stages = {name: {"seconds": 100.0} for name in ("pack_hdf5", "counterfactuals")}
    run = {"images": 10000, "stages": stages, "packed_bytes": {"train": 1}, "raw_bytes": 1,
           "train_questions_per_epoch": 1, "training_input": {"train_gflops_per_question": 1.0,
                                                               "loader_questions_per_s": 1.0}}
    params = {"counterfactuals": {"samples": 200}, "commands": {"splits": {"test": 0.1}}}
    assert extrapolate(run, 100000, 989.0, params)["stage_seconds"] == {"pack_hdf5": 1000, "counterfactuals": 100}
    small = {**run, "images": 1000}  # 100 test scenes, all edited: 200 at 100,000 images
    assert extrapolate(small, 100000, 989.0, params)["stage_seconds"] == {"pack_hdf5": 10000, "counterfactuals": 200}


def test_recipe_compute(tmp_path, tiny_params):
    """The recipe's planned training against the default's, on tiny params and a recipe of tiny sizes."""
    params, recipe = tmp_path / "params.yaml", tmp_path / "recipe.yaml"
    from tests.pipeline import _merge

    tiny_params["runtime"]["train"]["num_workers"] = 0
    params.write_text(yaml.safe_dump(_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), tiny_params)))
    sizes = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2}
    recipe.write_text(yaml.safe_dump({
        "scenes": {"num_images": 120}, "pack": {"image_size": 64}, "model": {"siglip": sizes, "gemma": sizes},
        "train": {"epochs": 3, "batch_size": 32}, "runtime": {"train": {"num_workers": 4}}}))
    report = run_benchmark("recipe_compute.py", tmp_path / "compute.json", "--params", str(params), "--recipe",
                           str(recipe), "--images", "40", "--count-batch", "8", "--gpu-steps-per-s", "2")
    default, gpu = report["default"], report["recipe"]
    assert (gpu["images"], gpu["epochs"], gpu["batch_size"], default["images"]) == (
        120, 3, 32, tiny_params["scenes"]["num_images"])
    for run in (default, gpu):
        assert run["train_questions"] == run["epochs"] * round(run["images"] * run["train_share"]
                                                                * run["train_questions_per_image"])
        assert run["train_pflops"] == pytest.approx(run["train_questions"] * run["train_gflops_per_question"] / 1e6,
                                                    rel=1e-3)
    assert gpu["train_gflops_per_question"] > default["train_gflops_per_question"] > 0  # more pixels, wider layers
    assert gpu["operators_per_step"] >= default["operators_per_step"] > 0  # the same layers, not fewer
    assert report["compute_multiple"] == pytest.approx(gpu["train_pflops"] / default["train_pflops"], abs=0.06)
    points = json.loads((ROOT / "metrics" / "scaling.json").read_text())["points"]
    assert [(p["series"], p["multiple"], p["accuracy"]) for p in report["curve"]] == [
        (p["series"], p["multiple"], p["accuracy"]) for p in points]
    series = {p["series"]: p["image_size"] for p in report["curve"]}  # each series told apart, with its image size
    assert {"128px", "128px, images"} <= series.keys() and series["128px"] == series["128px, images"] == 128
    rate = report["gpu_step_rate"]
    assert rate["questions_per_s"] == 64 and rate["training_minutes"] == pytest.approx(gpu["steps"] / 120, abs=0.06)
    assert rate["loader_questions_per_s_all_workers"] == pytest.approx(4 * gpu["loader_questions_per_s_one_process"],
                                                                       rel=1e-3)
    # the committed GPU runs' cost per operator, times these runs' operators
    estimate = report["gpu_launch_estimate"]
    assert [run["step_of"] for run in estimate["runs"]] == ["adamw", "per_matrix_muon"]
    for run in estimate["runs"]:
        assert run["us_per_operator"] == pytest.approx(run["ms_per_step"] / run["operators_per_step"] * 1e3, abs=0.01)
    costs = estimate["us_per_operator"]
    for name, run in (("default", default), ("recipe", gpu)):
        assert estimate[name]["ms_per_step"] == pytest.approx([run["operators_per_step"] * c / 1e3 for c in costs],
                                                              abs=0.06)
    fastest = estimate["recipe"]["steps_per_s"][1]
    assert estimate["recipe"]["training_seconds"][0] == pytest.approx(gpu["steps"] / fastest, abs=0.06)


@pytest.mark.pipeline
def test_gpu_session_runs_the_recipe_then_the_default(tmp_path, tiny_params):
    """benchmarks/gpu_session.sh on a tiny project (on the CPU, without its tests), in its default order: both
    pipelines' reports, the recipe's values in params.yaml while it ran (its model sizes set back to tiny ones by the
    arguments), then the default's."""
    from tests.pipeline import DvcProject

    project = DvcProject(tmp_path / "project", tiny_params)
    for name in ("benchmarks", "recipes"):
        shutil.copytree(ROOT / name, project.path / name, ignore=shutil.ignore_patterns("__pycache__"))
    tiny = {f"model.{part}.{key}": value for part in ("siglip", "gemma")
            for key, value in tiny_params["model"][part].items() if key != "patch_size"}
    overrides = [f"{key}={value}" for key, value in {
        **tiny, "pack.image_size": 32, "scenes.num_images": tiny_params["scenes"]["num_images"],
        "train.epochs": 1, "train.batch_size": 16, "runtime.train.compile": "false",
        "runtime.train.num_workers": 0}.items()]
    project.env["TESTS_S"] = "0"
    defaults = (project.path / "params.yaml").read_text()
    result = project.run("bash", "benchmarks/gpu_session.sh", str(tmp_path / "out"), *overrides, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    default, recipe = project.json("metrics/gpu/default.json"), project.json("metrics/gpu/recipe.json")
    assert default["pipeline_wall_s"] >= default["wall_s_through_evaluate"] > 0
    assert 0 < default["mfu"] < 1 and default["train"]["questions_per_s"] > 0
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(recipe["stage_seconds"]) == set(stages)  # the default's: the stages it ran (its images were there)
    assert {"train", "evaluate", "counterfactuals"} <= set(default["stage_seconds"]) < set(stages)
    assert all(seconds >= 0 for seconds in recipe["stage_seconds"].values())
    assert recipe["train"]["batch_size"] == 16 and recipe["images"] == tiny_params["scenes"]["num_images"]
    assert 0 <= recipe["test"]["accuracy"] <= 1 and recipe["matmul_peak_dtype"] == "float32"
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"default.tgz", "recipe.tgz"}
    with tarfile.open(tmp_path / "out" / "recipe.tgz") as archive:
        log = next(archive.extractfile(m) for m in archive if m.name.endswith("recipe_repro.log")).read().decode()
        lock = yaml.safe_load(next(archive.extractfile(m) for m in archive if m.name.endswith("recipe_dvc.lock")))
    assert re.search(r"^\[\d\d:\d\d:\d\d\] vlm epoch 1/1: +100%", log, re.M), log  # a progress update is a line
    assert lock["stages"]["train"]["params"]["params.yaml"]["train.lr"] == 0.004  # the recipe's, not overridden
    assert (project.path / "params.yaml").read_text() == defaults  # restored for the default pipeline


def test_gpu_session_keeps_to_its_deadline(tmp_path):
    """DEADLINE cuts each part's time limit, and a part with no time left does not start; limits are whole seconds."""
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "params.yaml").write_text("train: {epochs: 1}\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "TESTS_S": "0",
           "PARTS": "default recipe", "DEADLINE": "40"}  # less than the 45 s kept for the report
    session = ["bash", "benchmarks/gpu_session.sh", str(tmp_path / "out")]
    result = subprocess.run(session, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== default pipeline: no time left" in result.stdout and "== GPU recipe: no time left" in result.stdout
    result = subprocess.run(session, cwd=tmp_path, env={**env, "PARTS": ""}, capture_output=True, text=True,
                            check=False)  # no pipeline: what a call for the tests alone gives
    assert result.returncode == 0 and "==" not in result.stdout, result.stdout + result.stderr
    failing = {**env, "PARTS": "", "TESTS_S": "60", "TEST_WORKERS": "0", "TESTS_ARGS": "no_such_test.py"}
    result = subprocess.run(session, cwd=tmp_path, env=failing, capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "pytest exit 4" in result.stdout, result.stdout + result.stderr  # tests failed
    result = subprocess.run(session, cwd=tmp_path, env={**env, "DEFAULT_S": "7m"}, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 1 and "DEFAULT_S=7m: not a whole number of seconds" in result.stderr


def test_recipe_compute_reads_its_gpu_runs_before_measuring_and_names_a_mistyped_one():
    from benchmarks.recipe_compute import GPU_RUNS, gpu_run_inputs

    operators = ROOT / "metrics" / "bench_train_muon.json"
    runs = [f"metrics/gpu/{run}/default={tweak}" for run, tweak in GPU_RUNS]
    assert [(tweak, count > 0) for _, tweak, _, count in gpu_run_inputs(runs, operators)] == [
        (tweak, True) for _, tweak in GPU_RUNS]
    with pytest.raises(SystemExit, match=r"--gpu-run: expected FOLDER=TWEAK, got 'metrics/gpu/x'"):
        gpu_run_inputs(["metrics/gpu/x"], operators)
    with pytest.raises(SystemExit, match=r"bench_train_muon.json has no operators_per_step of a tweak 'sgd' \(it has "
                                         r"baseline, "):
        gpu_run_inputs([f"{runs[0].partition('=')[0]}=sgd"], operators)


def test_gpu_session_fails_when_its_report_does_and_help_starts_nothing(tmp_path):
    """A report that fails (here: a pipeline that wrote nothing, DVC a stub) fails the session; --help prints the
    script's usage and leaves params.yaml, DVC and the folders alone."""
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "params.yaml").write_text("train: {epochs: 1}\n")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "dvc").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'dvc_calls'}\n")
    (stubs / "dvc").chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "TESTS_S": "0", "PARTS": "default"}
    result = subprocess.run(["bash", "benchmarks/gpu_session.sh", str(tmp_path / "out")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, check=False)
    assert "dvc repro evaluate exit 0" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 1 and "gpu_report.py failed: no report of default" in result.stdout
    (tmp_path / "dvc_calls").unlink()
    for option in ("--help", "-n"):
        result = subprocess.run(["bash", "benchmarks/gpu_session.sh", option], cwd=tmp_path, env=env,
                                capture_output=True, text=True, check=False)
        assert result.returncode == (0 if option == "--help" else 1), result.stdout + result.stderr
        assert "benchmarks/gpu_session.sh OUT [key=value ...]" in result.stdout + result.stderr
        assert not (tmp_path / "dvc_calls").exists() and not (tmp_path / option).exists()
        assert (tmp_path / "params.yaml").read_text() == "train: {epochs: 1}\n"


def test_gpu_report_adds_the_pipeline_wall_time_without_torch(tmp_path):
    """The report's second call, after the whole pipeline, measures nothing: it starts without importing torch."""
    report = tmp_path / "default.json"
    report.write_text(json.dumps({"name": "default", "pipeline_wall_s": None}))
    code = ("import sys; from benchmarks.gpu_report import main; "
            f"main(['--name', 'default', '--pipeline-wall-s', '12.34', '--out', {str(report)!r}]); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    assert json.loads(report.read_text()) == {"name": "default", "pipeline_wall_s": 12.3}


def test_gpu_report_times_each_stage_from_the_stamped_log():
    from benchmarks.gpu_report import stage_seconds

    log = ("[23:59:50] Running stage 'train':\n[23:59:58] vlm epoch 1/6:  50%|#####\n"
           "[00:00:05] Running stage 'evaluate':\nno stamp: ignored\n[00:00:09] test: VLM 90.6%\n")
    assert stage_seconds(log) == {"train": 8.0, "evaluate": 4.0}  # train's last line at 23:59:58
    # two dvc repro calls with a report between them (benchmarks/gpu_session.sh): a stage ends at its lock-file line, or
    # without one (its dvc.lock entry unchanged) at its last line; DVC's closing lines and the second call's "skipping"
    # lines, stamped after the report, belong to no stage
    log = ("[10:00:00] Running stage 'evaluate':\n[10:00:04] test: VLM 39.1%\n"
           "[10:00:06] Updating lock file 'dvc.lock'\n"
           "[10:00:06] Use `dvc push` to send your updates to remote storage.\n"
           "[10:00:15] Stage 'evaluate' didn't change, skipping\n[10:00:15] Running stage 'counterfactuals':\n"
           "[10:00:20] Generating lock file 'dvc.lock'\n[10:00:20] Updating lock file 'dvc.lock'\n")
    assert stage_seconds(log) == {"evaluate": 6.0, "counterfactuals": 5.0}
    unchanged = ("[10:00:00] Running stage 'evaluate':\n[10:00:04] test: VLM 39.1%\n"
                 "[10:00:05] To track the changes with git, run:\n[10:00:15] Stage 'evaluate' didn't change, skipping\n"
                 "[10:00:15] Running stage 'counterfactuals':\n[10:00:18] mirror: 200 pairs\n"
                 "[10:00:25] Stage 'profile_dataloader' is cached - skipping run, checking out outputs\n")
    assert stage_seconds(unchanged) == {"evaluate": 4.0, "counterfactuals": 3.0}
    assert stage_seconds("[10:00:00] Stage 'train' didn't change, skipping\n") == {}


@pytest.mark.xdist_group("tiny_project")
def test_training_beside_busy_processes_gives_the_same_model_bytes(tmp_path, tiny_project, tiny_params):
    """Same params, same machine, same bytes, also when the machine is busy (every core's thread in use)."""
    tiny_params["runtime"]["train"]["threads"] = 0  # all cores: a kernel split over threads is what load could skew
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params))
    report = run_benchmark("under_load.py", tmp_path / "load.json", "--params", str(tmp_path / "params.yaml"),
                           "--data", str(tiny_project.processed), "--epochs", "1")
    assert report["busy_processes"] == len(os.sched_getaffinity(0))
    assert report["identical"], report


def test_under_load_shows_why_a_training_run_failed(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "under_load.py"), "--data",
                             str(tmp_path / "nothing"), "--epochs", "1"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"the train stage (idle) exited 1:\nerror: vocab file not found: {tmp_path / 'nothing'}" in result.stderr


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tiny_project) -> Path:
    """A tiny default-shaped model trained one epoch on the tiny project (the error benchmarks read it)."""
    paths = paths_for(tiny_project.processed, tmp_path_factory.mktemp("tiny_model"))
    train(TINY_MODEL, tiny_train_config(epochs=1), paths, progress=False, frame_size=FRAME_SIZE, runtime=TINY_RUNTIME)
    return paths.model


@pytest.mark.xdist_group("tiny_project")
def test_count_errors(tmp_path, tiny_project, tiny_model):
    """benchmarks/count_errors.py on a tiny model: every val image's counts of each category, grouped; the sheet of
    the worst-counted images draws each at twice the model's pixels, three to a row."""
    report = run_benchmark("count_errors.py", tmp_path / "counts.json", "--model", str(tiny_model),
                           "--data", str(tiny_project.processed), "--raw", str(tiny_project.root / "data" / "raw"),
                           "--sheet", str(tmp_path / "sheet.png"), "--sheet-examples", "4")
    images = len({r["image_id"] for r in tiny_project.records["val"]})
    assert report["images"] == images
    assert [row["category"] for row in report["exact"]] == ["car", "pedestrian"]
    assert all(row["images"] == images and 0 <= row["exact"] <= 1 for row in report["exact"])
    assert sum(row["images"] for row in report["by_true_count"]) == 2 * images
    for key in ("two_or_more_by_occluded", "two_or_more_by_close"):
        several = sum(row["images"] for row in report["by_true_count"] if row["true"] >= 2)
        assert sum(row["images"] for row in report[key]) == several
    assert "how_many" not in report  # without --predictions
    packed = PackedImageReader(tiny_project.processed / "val_images.h5")
    with Image.open(tmp_path / "sheet.png") as sheet:  # 4 tiles: two rows of 3, each image over two caption lines
        assert sheet.size == (3 * 2 * packed.image_width + 4 * 4, 2 * (2 * packed.image_size + 6 + 2 * 17) + 3 * 4)


def test_count_sheet_draws_each_label_box_where_its_frame_coordinates_fall():
    """A 400 x 100 frame read as 40 x 20 pixels, enlarged twice: a box's corner (x, y) lands at (x / 5, y / 2.5),
    visible boxes green, occluded red, three tiles to a row."""
    from benchmarks.count_errors import boxes_sheet

    pixels = Image.new("RGB", (40, 20))
    sheet = boxes_sheet([(pixels, [((100, 20, 200, 60), False), ((300, 50, 380, 90), True)], [("caption", (0, 0, 0))])],
                        frame_size=(400, 100))
    assert sheet.width == 3 * 80 + 4 * 4
    assert sheet.getpixel((4 + 20, 4 + 8)) == (40, 230, 60) and sheet.getpixel((4 + 40, 4 + 24)) == (40, 230, 60)
    assert sheet.getpixel((4 + 60, 4 + 20)) == (255, 40, 40) and sheet.getpixel((4 + 76, 4 + 36)) == (255, 40, 40)
    assert sheet.getpixel((4 + 30, 4 + 16)) == (0, 0, 0)  # inside the box: the image's own pixels


@pytest.mark.xdist_group("tiny_project")
def test_count_errors_sets_the_decoders_answers_beside_the_heads_counts(tmp_path, tiny_project, tiny_model):
    """--predictions: each "how many" question's decoder answer (evaluate's ``correct``) beside the counts head's
    rounded count, in bands of the head's distance from a whole number; predictions of another split are refused."""
    asked = [{**r, "counting_category": "car" if " car" in r["command"] else "pedestrian",
              "correct": index % 2 == 0} for index, r in enumerate(tiny_project.records["val"])
             if r["template"] == "counting/how_many"]
    assert asked, "the tiny val split asks how many"
    pd.DataFrame(asked).to_csv(tmp_path / "predictions.csv", index=False)
    args = ["--model", str(tiny_model), "--data", str(tiny_project.processed),
            "--raw", str(tiny_project.root / "data" / "raw"), "--predictions", str(tmp_path / "predictions.csv")]
    report = run_benchmark("count_errors.py", tmp_path / "counts.json", "--calibrated", *args)
    overall, = report["how_many"]
    assert overall["questions"] == len(asked)
    assert overall["decoder_exact"] == round(sum(a["correct"] for a in asked) / len(asked), 4)
    assert 0 <= overall["head_exact"] <= 1 and 0 <= overall["calibrated_exact"] <= 1
    assert report["calibrated_on"] == {"split": "train", "images": len({r["image_id"]
                                                                        for r in tiny_project.records["train"]})}
    assert sum(c["questions"] for c in report["how_many_by_category"]) == len(asked)
    bands = report["how_many_by_head_distance"]
    assert sum(band["questions"] for band in bands) == len(asked)
    assert {band["head_distance"] for band in bands} <= {"[0, 0.1]", "(0.1, 0.2]", "(0.2, 0.3]", "(0.3, 0.4]",
                                                         "(0.4, 0.5]"}
    pd.DataFrame([{**asked[0], "image_id": "not-in-val"}]).to_csv(tmp_path / "other.csv", index=False)

    def refused(*arguments: str) -> str:
        """The message the script exits with (in this process: a refusal's start-up would take most of the test)."""
        from benchmarks.count_errors import main

        with pytest.raises(SystemExit) as refusal:
            main([*arguments, "--out", str(tmp_path / "refused.json")])
        assert isinstance(refusal.value.code, str) and not (tmp_path / "refused.json").exists(), refusal.value.code
        return refusal.value.code

    assert "not in the split counted, e.g. not-in-val" in refused(*args[:-1], str(tmp_path / "other.csv"))
    assert f"--predictions: {tmp_path / 'none.csv'} not found" in refused(*args[:-1], str(tmp_path / "none.csv"))
    assert "--calibrated: needs --predictions" in refused("--calibrated")
    assert "--sheet-examples: must be at least 1, got 0" in refused("--sheet-examples", "0")
    assert "fitted on the train split; answer another" in refused("--calibrated", "--split", "train", *args[-2:])


def test_calibrated_counts_learn_what_the_density_statistics_say():
    """A density that counts 0.8 of each object and a column of noise: the classifier fitted on the train images
    counts nearly all of the split's images right (its bins' edges may cut a class's tail), where rounding the
    density's sum misses every count from 3 on."""
    from benchmarks.count_errors import calibrated_counts

    rng = np.random.default_rng(0)

    def images(prefix: str, number: int) -> tuple[list[str], np.ndarray, dict]:
        ids, counts = [f"{prefix}{i}" for i in range(number)], rng.integers(0, 7, number)
        statistics = np.stack([0.8 * counts + rng.normal(0, 0.02, number), rng.normal(0, 1, number)], axis=1)
        return ids, statistics, {i: {"car": int(c)} for i, c in zip(ids, counts)}

    (train_ids, train_statistics, train_true), (ids, statistics, true) = images("t", 400), images("s", 100)
    counted = calibrated_counts((train_ids, train_statistics), train_true, (ids, statistics), ["car"])
    assert sum(counted[i] == true[i] for i in ids) >= 95
    assert sum(round(s) != true[i]["car"] for i, s in zip(ids, statistics[:, 0])) >= 40


@pytest.mark.xdist_group("tiny_project")
def test_spatial_errors(tmp_path, tiny_project, tiny_model):
    """benchmarks/spatial_errors.py on a tiny model: every spatial question of the split in one group, each share a
    share."""
    raw = str(tiny_project.root / "data" / "raw")
    report = run_benchmark("spatial_errors.py", tmp_path / "spatial.json", "--model", str(tiny_model),
                           "--splits", "val", "--data", str(tiny_project.processed), "--raw", raw)
    spatial = [r for r in tiny_project.records["val"] if r["template"] == "spatial/on_side"]
    assert spatial and sum(row["questions"] for row in report["val"]) == len(spatial)
    assert {row["labels"] for row in report["val"]} <= {"yes", "no, absent", "no, elsewhere"}
    for row in report["val"]:
        assert all(0 <= row[k] <= 1 for k in ("perception_right", "decoder_right"))


@pytest.mark.xdist_group("tiny_project")
def test_real_perception_sets_each_heads_presence_beside_the_decoders_answer(tmp_path, tiny_project, tiny_model):
    """benchmarks/real_perception.py on frames in BDD100K's layout: every presence question the labels answer, per
    head (counts, grounding), category and label, the head's and the decoder's shares right."""
    from test_real import bdd_layout

    root = bdd_layout(tmp_path / "bdd", frames=3)
    report = run_benchmark("real_perception.py", tmp_path / "perception.json", "--root", str(root),
                           "--model", str(tiny_model), "--vocab", str(tiny_project.processed / "vocab.json"))
    assert report["frames"] == 3 and report["questions"] > 0
    for head in ("counts", "grounding"):
        assert sum(row["questions"] for row in report[head]) == report["questions"]
        assert {row["labels"] for row in report[head]} <= {"yes", "no"}
        for row in report[head]:
            assert 0 <= row["perception_right"] <= 1 and 0 <= row["decoder_right"] <= 1
    assert [(r["category"], r["decoder_right"]) for r in report["counts"]] == \
        [(r["category"], r["decoder_right"]) for r in report["grounding"]]  # one decoder, two heads


@pytest.mark.xdist_group("tiny_project")
def test_light_probe_reports_each_colours_lights_found_and_read(tmp_path, tiny_project, tiny_model):
    """benchmarks/light_probe.py: per true colour of the governing light, the grounding head's median highest
    probability of each colour, and the shares of lights it finds and reads, on the test split and real frames."""
    from test_real import bdd_layout

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import light_probe

    report = run_benchmark("light_probe.py", tmp_path / "lights.json", "--root", str(bdd_layout(tmp_path / "bdd")),
                           "--model", str(tiny_model), "--vocab", str(tiny_project.processed / "vocab.json"),
                           "--raw", str(tiny_project.root / "data" / "raw"),
                           "--commands", str(tiny_project.processed / "commands"))
    assert set(report) == {"command", "model_sha256", "synthetic_test", "real"}
    for row in report["synthetic_test"].values():
        assert row["lights"] > 0 and 0 <= row["found"] <= 1 and set(row["median_highest"]) == {"red", "yellow",
                                                                                               "green"}
    probabilities = np.array([[0.9, 0.2, 0.1], [0.4, 0.6, 0.1], [0.1, 0.2, 0.3]])
    assert light_probe.summary(["red", "red", "green"], probabilities) == {
        "red": {"lights": 2, "median_highest": {"red": 0.65, "yellow": 0.4, "green": 0.1}, "found": 0.5, "read": 0.5},
        "green": {"lights": 1, "median_highest": {"red": 0.1, "yellow": 0.2, "green": 0.3}, "found": 0.0,
                  "read": 1.0}}


def test_lamp_colors_takes_the_brightest_tenth_of_each_coloured_lights_box():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import lamp_colors

    from vlm.scenes.schema import Scene, SceneObject

    image = np.full((40, 40, 3), 30, np.uint8)
    image[10:30, 10:20] = (40, 40, 40)  # a light's housing, 10 x 20 px
    image[12:16, 12:18] = (250, 60, 50)  # its lit lamp: 24 of its 200 pixels
    light = SceneObject(id="0", category="traffic light", box=(10, 10, 19, 29), light_color="red")
    dark = SceneObject(id="1", category="traffic light", box=(25, 10, 30, 20), light_color=None)
    scene = Scene(name="a.jpg", weather="clear", scene="city street", timeofday="night", objects=(light, dark))
    [(color, lamp, box)] = lamp_colors.lamp_pixels(image, scene)
    assert color == "red" and lamp.tolist() == [250, 60, 50]
    np.testing.assert_allclose(box, [(24 * v + 176 * 40) / 200 for v in (250, 60, 50)], rtol=1e-5)
    assert lamp_colors.measure([(image, scene)])["red/night"]["lights"] == 1
