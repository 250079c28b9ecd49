"""The README's numbers are those of the committed metrics (a full default run's), not typed in by hand."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _json(path: str) -> dict:
    return json.loads((ROOT / path).read_text(encoding="utf-8"))


def test_the_training_time_ratio_is_its_steps_over_its_speedup():
    """The README's training-time row (`make readme`) reads a ratio that is the step counts' over the step speed's."""
    new, old = (_json("metrics/bench_train_against.json")["results"][k] for k in ("params", "baseline"))
    assert abs(new["training_time_ratio"] - new["training_steps"] / old["training_steps"] / new["speedup"]) < 2e-3

def _gpu_path() -> str:
    """docs/experiments.md's "The GPU path: where it stands" (the README's GPU bullet links to it), on one line."""
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    return " ".join(text.split("## The GPU path: where it stands", 1)[1].split("\n## ", 1)[0].split())


def test_gpu_path_is_the_committed_gpu_run():
    text = _gpu_path()
    folder = "metrics/gpu/h200-2026-11-26b"
    run = f"{folder}/default"
    # beside the GPU's files: git show f908e5c:metrics/train_timing.json, this CPU's committed run of the same code
    gpu, cpu = _json(f"{run}/train_timing.json"), _json(f"{folder}/cpu_train_timing.json")
    accuracy = _json(f"{run}/eval.json")["vlm"]["accuracy"]
    assert (f"ran at {gpu['questions_per_s']:,.0f} questions/s (the CPU run of the same code, an earlier session's "
            f"machine: {cpu['questions_per_s']:.0f}, `{folder}/cpu_train_timing.json`) to test accuracy "
            f"{accuracy:.3f}") in text


def test_recipe_expectation_is_the_committed_count():
    text = _gpu_path()
    compute = _json("metrics/recipe_compute.json")
    assert f"It is {compute['compute_multiple']:.0f} times the default run's training FLOPs" in text
    operators = compute["recipe"]["operators_per_step"], compute["default"]["operators_per_step"]
    assert "Its step dispatches {:,.0f} operators (the default's {:,.0f})".format(*operators) in text
    trend = _json("metrics/scaling.json")["targets"]["0.97"]["128px"]["multiple_needed_by_trend"]
    assert f"on the default shape the curve's trend reaches 0.97 at {trend:.1f}x" in text
    assert f"rather than the {compute['gpu_step_rate']['steps_per_s']} it was sized for" in text


def test_launch_estimate_numbers_are_the_committed_report():
    """The GPU step predicted from its operators: docs (the GPU path's summary too) from recipe_compute.json."""
    docs = " ".join((ROOT / "docs" / "experiments.md").read_text(encoding="utf-8").split())
    compute = _json("metrics/recipe_compute.json")
    estimate = compute["gpu_launch_estimate"]
    for run in estimate["runs"]:
        assert (f"| {run['operators_per_step']:,.0f} | {run['ms_per_step']:.2f} | {run['us_per_operator']:.2f} |"
                in docs), run
    low, high = estimate["us_per_operator"]
    default, recipe = estimate["default"], estimate["recipe"]
    rates = "{:.1f}-{:.1f} steps/s".format(*recipe["steps_per_s"])
    phrases = [f"{low:.1f}-{high:.1f} µs per operator",
               "takes {:.0f}-{:.0f} ms on the H200".format(*default["ms_per_step"]),
               "{:,.0f}-{:,.0f} questions/s".format(*(round(q, -1) for q in default["questions_per_s"])),
               "{:.0f}-{:.0f} ms, ".format(*recipe["ms_per_step"]) + rates,
               "its {:,.0f} steps train in {:.0f}-{:.0f} s".format(compute["recipe"]["steps"],
                                                                  *recipe["training_seconds"]),
               "the {:,.0f}-{:,.0f} that".format(*(round(q, -2) for q in recipe["questions_per_s"]))]
    for phrase in phrases:
        assert phrase in docs, phrase
    loader = compute["recipe"]["loader_questions_per_s_one_process"]
    assert (f"{loader:,.0f} questions/s from HDF5 at 448 x 256" in docs
            and f"up to about {round(loader * compute['recipe']['num_workers'], -2):,.0f}" in docs)
    assert f"{low:.1f}-{high:.1f} µs per operator, so it may run {rates}" in _gpu_path()


def test_stacked_muon_numbers_are_the_committed_benchmark():
    text = " ".join((ROOT / "docs" / "experiments.md").read_text(encoding="utf-8").split())
    results = _json("metrics/bench_train_muon.json")["results"]
    loop, adamw = results["per_matrix_muon"], results["adamw"]
    low, high = loop["speedup_range"]
    assert f"1/{loop['speedup']:.3f} = {1 / loop['speedup']:.2f}x as long (rounds {low:.2f}-{high:.2f} in speed" in text
    assert loop["loss_max_abs_diff"] == 0.0 and "the same losses for 20 steps" in text
    assert (f"AdamW's step is {adamw['speedup']:.3f}x as fast as the stacked Muon's ({adamw['speedup_range'][0]:.2f}-"
            f"{adamw['speedup_range'][1]:.2f})") in text
    for name in ("baseline", "per_matrix_muon", "adamw"):  # the operator table's rows
        ops, speed = results[name]["operators_per_step"], results[name]["speedup"]
        time = "1" if name == "baseline" else f"{1 / speed:.2f}x"
        assert f"| {ops['optimizer']:,.0f} | {ops['total']:,.0f} | {time} |" in text, name
        assert (f"dispatch {ops['forward_backward']:,.0f} at the defaults and the step's bookkeeping "
                f"{ops['bookkeeping']:.0f}") in text
    assert f"default step reads back {results['baseline']['operators_per_step']['device_reads']:.0f} times" in text


def test_determinism_claim_is_the_committed_check():
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "the same model bytes, also beside busy processes" in text
    report = _json("metrics/under_load.json")
    assert report["identical"] and report["busy_processes"] >= 2


def test_training_step_numbers_are_the_committed_benchmark():
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    step = _json("metrics/bench_train_step.json")
    for number in (f"{step['batch_questions']:.0f} questions", f"{step['ms_per_step']:.0f} ms",
                   f"{step['questions_per_s']:.0f} questions/s", f"{step['train_gflops_per_question']:.3f} GFLOP",
                   f"{step['achieved_gflops_per_s']:.0f} GFLOP/s", f"{step['matmul_peak_gflops_per_s']:.0f} GFLOP/s",
                   f"{step['mfu']:.1%}"):
        assert number in text, number
    for row in step["profile"]["rows"]:
        line = next((line for line in text.splitlines() if line.startswith(f"| {row['part']} |")), None)
        if line is not None:  # the smallest parts share one row
            assert f"| {row['ms']:.1f} |" in line and f"| {row['share']:.1%} |" in line, row["part"]


def test_scaling_table_is_the_committed_curve():
    """Each row of the accuracy-vs-compute table (docs/experiments.md) is a point of metrics/scaling.json (make
    scaling)."""
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    curve = _json("metrics/scaling.json")
    for point in curve["points"]:
        per_type = " | ".join(f"{point['per_type'][t]:.3f}" for t in sorted(point["per_type"]))
        compute = f"{point['epochs']} epochs" + (f" of {point['num_images']:,} scenes"
                                                 if point["series"].endswith(", images") else "")
        row = (f"| {point['image_size']} px | {point['multiple']}x ({compute}) | "
               f"{point['seconds']:.0f} | {point['accuracy']:.3f} | {per_type} |")
        assert row in text, row
    section = text.split("## Accuracy vs training compute", 1)[1].split("\n## ", 1)[0]
    flat = " ".join(section.split())  # the prose wraps anywhere
    for level, sizes in curve["targets"].items():
        for size, entry in sizes.items():
            if entry["reached_at_multiple"] is not None:
                assert f"reaches {level} at {entry['reached_at_multiple']}x" in flat, (level, size)
            elif entry.get("multiple_needed_by_trend") is not None:
                trend = (f"{entry['gain_per_doubling']:.3f}", f"{level} at {entry['multiple_needed_by_trend']:.1f}x")
                for number in trend:
                    assert number in flat, (level, size, number)
    missing = ", ".join(f"`{name}`" for name in curve["missing"])
    assert (f"Not yet run: {missing}." in flat) if missing else "Not yet run" not in flat


def test_scaling_paragraph_is_the_committed_curve():
    """docs/experiments.md's "Accuracy vs training compute" in short: each 128 px point's accuracy, counting and
    geometric counterfactuals, and where the trend puts 0.97, from metrics/scaling.json."""
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8").split("## Accuracy vs training compute", 1)[1]
    flat = " ".join(text.split("**In short.**", 1)[1].split("\n\n", 1)[0].split())
    curve = _json("metrics/scaling.json")
    points = {p["multiple"]: p for p in curve["points"] if p["series"] == "128px"}
    accuracies = [f"{points[1]['accuracy']:.3f} at 1x"] + [
        f"{points[m]['accuracy']:.3f} at {m}x ({points[m]['epochs']} epochs)" for m in (2, 4)]
    counting = [f"({points[1]['per_type']['counting']:.3f})", f"{points[2]['per_type']['counting']:.3f} at 2x",
                f"{points[4]['per_type']['counting']:.3f} at 4x"]

    def changed(multiple: int) -> str:  # mirror, move left to right, add a pedestrian
        rates = points[multiple]["counterfactuals_changed_when_they_must"]
        return f"{rates['mirror']:.2f}, {rates['move_left_to_right']:.2f} and {rates['add_pedestrian']:.2f}"

    rates = [f"{changed(1)} of the time at 1x", f"{changed(4)} at 4x"]
    trend = f"the trend puts 0.97 at {curve['targets']['0.97']['128px']['multiple_needed_by_trend']:.1f}x"

    def accuracy_and_counting(series: str, counting_prefix: str = "") -> list[str]:
        points = [p for p in curve["points"] if p["series"] == series]
        assert points, series
        return [f"{p['accuracy']:.3f} at {p['multiple']}x" for p in points] + [
            f"{counting_prefix}{p['per_type']['counting']:.3f}" for p in points]

    images = [p for p in curve["points"] if p["series"] == "128px, images"]
    assert min(min(p["per_type"].values()) for p in images) > 0.85  # "every type above 0.85 from 2x on"
    pixels_1x = next(p for p in curve["points"] if p["series"] == "224px" and p["multiple"] == 1)
    step_cost = f"each step {pixels_1x['train_seconds'] / points[1]['train_seconds']:.1f} times as long"
    for number in (*accuracies, *counting, *rates, trend, *accuracy_and_counting("128px, images"),
                   *accuracy_and_counting("224px", "counting "), step_cost):
        assert number in flat, number


def test_holdout_paragraph_is_the_committed_gap():
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    gap = _json("metrics/holdout.json")
    mix = gap["same_mix"]
    text = " ".join(text.split())
    for number in (f"on the {gap['frames']} rainy nights", f"{mix['seen_in_training']:.3f} for the model",
                   f"{mix['held_out']:.3f} for the one", f"a gap of {mix['gap']:.3f} with a standard error of "
                   f"{mix['gap_standard_error']:.3f}"):
        assert number in text, number


def test_memory_table_is_the_committed_benchmark():
    """The table in docs/experiments.md, and the README's summary of it."""
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    report = _json("metrics/bench_memory.json")
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"every stage stays within {max(report['growth'].values()):.2f}x" in readme
    assert f"{report['runs'][-1]['stages']['counterfactuals']['peak_rss_mib']:,.0f} MiB for its 200 scenes" in readme
    small, large = report["runs"]
    for name in small["stages"]:
        row = (f"| {name} | {small['stages'][name]['peak_rss_mib']:.0f} | {large['stages'][name]['peak_rss_mib']:.0f} "
               f"| {report['growth'][name]:.2f}x |")
        assert row in text, row


def test_full_size_paragraph_is_the_committed_extrapolation():
    text = " ".join((ROOT / "docs" / "experiments.md").read_text(encoding="utf-8").split())
    report = _json("metrics/bench_memory_224px.json")
    run, scaled = report["runs"][-1], report["extrapolated"]
    seconds, gpu, probe = scaled["stage_seconds"], scaled["gpu_epoch"], run["training_input"]
    expected = [
        f"on {run['images']:,} synthetic images at {run['image_size']} px",
        f"linearly to {scaled['images']:,} images",
        f"`generate_commands` {seconds['generate_commands']} s",
        f"`pack_hdf5` {seconds['pack_hdf5']} s ({scaled['packed_bytes'] / 1e9:.1f} GB of HDF5 beside "
        f"{scaled['raw_bytes'] / 1e9:.1f} GB of JPEG)",
        f"one CPU training epoch of {scaled['train_questions_per_epoch']:,} questions {seconds['train (HDF5)']} s",
        f"{run['stages']['train (HDF5)']['peak_rss_mib']:.0f} MiB peak",
        f"at least {gpu['loader_seconds']:.0f} s",
        f"({probe['loader_questions_per_s']:,.0f} questions/s from HDF5",
        f"({probe['train_gflops_per_question']} GFLOP per question) is {gpu['arithmetic_seconds_at_peak']:.2g} s "
        f"at an H100's {gpu['peak_tflops']:.0f} TFLOP/s",
    ]
    for phrase in expected:
        assert phrase in text, phrase


@pytest.mark.xdist_group("repository_dvc")  # one DVC command at a time in the repository (its lock)
def test_pipeline_diagram_is_dvc_dag():
    """The README's mermaid block has the edges of ``dvc dag --mermaid``, grouped as ``a --> b & c``."""
    dvc = Path(sys.executable).parent / "dvc"
    dag = subprocess.run([str(dvc), "dag", "--mermaid"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    names = dict(re.findall(r'(node\d+)\["(\w+)"\]', dag))
    expected = {(names[a], names[b]) for a, b in re.findall(r"(node\d+)-->(node\d+)", dag)}
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("```mermaid", 1)[1].split("```", 1)[0]
    drawn = {(source, target.strip()) for source, targets in re.findall(r"^\s*(\w+) --> (.+)$", block, flags=re.M)
             for target in targets.split("&")}
    assert expected and drawn == expected


def test_the_loaders_hdf5_rate_the_docs_compare_with_is_the_committed_profile():
    """docs/experiments.md ("Memory per stage") sets the train loader's rate beside profile_dataloader's best from
    HDF5 at 224 px, the committed run's."""
    text = " ".join((ROOT / "docs" / "experiments.md").read_text(encoding="utf-8").split())
    rate = max(_json("metrics/dataloader.json")["samples_per_s"]["224px"]["ours_hdf5"].values())
    assert f"far below the {rate:,.0f} that `profile_dataloader` measures from HDF5 at 224 px" in text


def test_the_tokenizer_row_is_the_committed_benchmark():
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    report = _json("metrics/bench_tokenizer.json")
    rate, ratio = report["commands_per_s"], report["speedup_vs_textbook"]
    assert (f"{report['num_commands']:,} commands | {rate['batch_encode'] / 1e6:.2f} M commands/s, "
            f"{ratio['batch_encode']:.2f}x the textbook per-command recipe; {ratio['batch_encode_no_cache']:.2f}x with "
            f"its cache off (the commands are {report['distinct_commands']} distinct strings)") in text


def test_the_decode_row_is_the_committed_benchmark():
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    report = _json("metrics/bench_pack.json")
    bicubic = report["decode"]["128px"]["bicubic"]
    assert (f"to {report['image_widths']['128px']} x 128 bicubic (the pack stage's default) | "
            f"{bicubic['draft_speedup']:.2f}x less CPU, {bicubic['draft_psnr_db_vs_full_decode']:.1f} dB PSNR") in text


def test_the_result_tables_are_what_make_readme_writes(tmp_path):
    """The tables of the README (the synthetic test split, the real frames, the speeds) and of docs/experiments.md
    (the counterfactuals) are `make readme`'s output from the committed metrics; a number edited by hand is found."""
    from vlm import readme

    texts = {name: (ROOT / name).read_text(encoding="utf-8") for name in readme.DOCUMENTS}
    assert set(m[2] for text in texts.values() for m in readme.BLOCK.finditer(text)) == set(readme.TABLES)
    assert all(readme.differing(text, ROOT / "metrics") == [] for text in texts.values())
    text = texts["README.md"]
    eval_json = _json("metrics/eval.json")
    edited = text.replace(f"**{eval_json['vlm']['accuracy']:.3f}**", "**0.999**", 1)
    assert edited != text and readme.differing(edited, ROOT / "metrics") == ["results"]

