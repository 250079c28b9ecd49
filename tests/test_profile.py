"""profile_dataloader: the naive baseline's numbers, the metrics layout and the plot."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from tiny_project import PACK_SIZE
from vlm.config import ParamError, build_config
from vlm.data.dataset import TrafficVQADataset
from vlm.data.h5file import PackedImageReader
from vlm.data.naive import NaiveTrafficVQADataset, build_naive_loader
from vlm.data.pack import repack_resized
from vlm.data.profile import LOADERS, ProfileConfig, profile_dataloaders
from vlm.plots import dataloader_figure, save_figure


@pytest.fixture
def project(colour_project):
    return colour_project


def test_naive_loader_yields_what_ours_yields_in_float(project):
    tokenizer = project.tokenizer()
    naive = NaiveTrafficVQADataset(project.commands("train"), project.h5("train"), tokenizer)
    ours = TrafficVQADataset(project.commands("train"), project.h5("train"), tokenizer)
    mean, std = torch.from_numpy(ours.images.mean)[:, None, None], torch.from_numpy(ours.images.std)[:, None, None]
    for index in (0, 9):
        expected = (ours[index]["image"].float() / 255 - mean) / std
        torch.testing.assert_close(naive[index]["image"], expected)
        ids = ours[index]["question_ids"].tolist() + ours[index]["answer_ids"].tolist()
        assert naive[index]["input_ids"][:len(ids)].tolist() == ids
        answer_ids = ours[index]["answer_ids"].tolist()
        assert naive[index]["labels"][len(ours[index]["question_ids"]):len(ids)].tolist() == answer_ids
    batch = next(iter(build_naive_loader(naive, batch_size=4, num_samples=40)))
    assert batch["image"].shape == (4, 3, PACK_SIZE, PACK_SIZE) and batch["image"].dtype == torch.float32
    assert len(build_naive_loader(naive, batch_size=4, num_samples=40)) == 10


def test_repack_resized_keeps_ids_stats_and_content(project, tmp_path):
    out = tmp_path / "big.h5"
    repack_resized(project.h5("train"), out, 48, max_images=4)
    src, big = PackedImageReader(project.h5("train")), PackedImageReader(out)
    assert big.image_size == 48 and big.image_ids == src.image_ids[:4]
    np.testing.assert_array_equal(big.mean, src.mean)
    small = src.read_into([2], np.empty((1, PACK_SIZE, PACK_SIZE, 3), np.uint8))[0]
    large = big.read_into([2], np.empty((1, 48, 48, 3), np.uint8))[0]
    expected = np.asarray(Image.fromarray(small).resize((48, 48), Image.Resampling.BICUBIC))
    np.testing.assert_array_equal(large, expected)


def test_profile_measures_every_configuration_and_summarises(project, tmp_path):
    config = ProfileConfig(workers=[0, 1], batch_sizes=[4, 8], extra_image_sizes=[48], warmup_batches=1,
                           batches=2, rounds=1, max_images=4)
    metrics = profile_dataloaders(project.commands("train"), project.h5("train"), project.tokenizer(), config,
                                  log=lambda message: None)
    assert metrics["images"] == 4 and metrics["questions"] == 20 and metrics["questions_per_image"] == 5.0
    assert set(metrics["samples_per_s"]) == {f"{PACK_SIZE}px", "48px"}
    for size, tables in metrics["samples_per_s"].items():
        assert set(tables) == set(LOADERS)
        for table in tables.values():
            assert set(table) == {"workers0_batch4", "workers0_batch8", "workers1_batch4", "workers1_batch8"}
            assert all(v > 0 for v in table.values())
        best = metrics["best"][size]
        assert best["naive"]["samples_per_s"] == max(tables["naive"].values())
        assert best["ours"]["samples_per_s"] == max(max(tables[n].values()) for n in ("ours_hdf5", "ours_ram"))
        assert metrics["speedup"][size] == round(best["ours"]["samples_per_s"] / best["naive"]["samples_per_s"], 2)
    assert metrics["targets"]["speedup_met"] == all(s >= 10 for s in metrics["speedup"].values())
    assert "samples_per_s_224px_met" not in metrics["targets"]
    plot = tmp_path / "plots" / "dataloader.png"
    save_figure(dataloader_figure(metrics), plot, dpi=100)
    with Image.open(plot) as image:
        assert image.format == "PNG" and image.width > 600


def test_profile_config_errors_name_the_key():
    with pytest.raises(ParamError, match="profile.workers"):
        build_config(ProfileConfig, {"workers": [-1]}, "profile")
    with pytest.raises(ParamError, match="profile.batches"):
        build_config(ProfileConfig, {"batches": 0}, "profile")


def test_stage_script_writes_metrics_and_plot(colour_project, tmp_path, monkeypatch):
    import yaml

    from stages.profile_dataloader import main

    project = colour_project.copy_to(tmp_path / "project")
    project.tokenizer().save_vocab(project.processed / "vocab.json")
    params = {"profile": {"workers": [0], "batch_sizes": [8], "extra_image_sizes": [], "warmup_batches": 1,
                          "batches": 2, "rounds": 1}}
    (project.root / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(project.root)
    main(["--data", "data/processed", "--metrics", "metrics/dataloader.json", "--plot", "metrics/plots/dataloader.png"])
    metrics = json.loads((project.root / "metrics" / "dataloader.json").read_text())
    assert set(metrics["speedup"]) == {f"{PACK_SIZE}px"}
    assert (project.root / "metrics" / "plots" / "dataloader.png").stat().st_size > 0
