"""TrafficVQADataset, collate, grouped sampler, augmentation and the DataLoader built from them."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from tiny_project import PACK_SIZE, SPLIT_SIZES, image_colours
from vlm.batch import IGNORE_INDEX
from vlm.config import ParamError, build_config
from vlm.data.augment import MAX_HUE, AugmentConfig, augment_image, sample_augment_params
from vlm.data.collate import collate_questions
from vlm.data.dataset import TrafficVQADataset
from vlm.data.loader import build_loader, set_epoch
from vlm.data.mirror import swap_left_right
from vlm.data.sampler import GroupedBatchSampler
from vlm.models.perception.targets import CHANNELS, TargetTransform
from vlm.scenes.generate import ScenesConfig
from vlm.tokenizer import SEP

FRAME = (ScenesConfig().width, ScenesConfig().height)  # the frame the head targets are laid out on
MIRROR_ONLY = AugmentConfig.mirror_only()


@pytest.fixture(scope="module")
def project(colour_project):
    return colour_project


@pytest.fixture(scope="module")
def tokenizer(project):
    return project.tokenizer()


def dataset(project, tokenizer, split="train", **kwargs):
    return TrafficVQADataset(project.commands(split), project.h5(split), tokenizer, **kwargs)


def stored_image(project, split, image_id):
    with h5py.File(project.h5(split), "r") as f:
        row = list(f["image_ids"].asstr()[:]).index(image_id)
        return torch.from_numpy(f["images"][row]).permute(2, 0, 1)  # [3, S, S]


def test_one_sample_per_question_with_shapes_and_dtypes(project, tokenizer):
    data = dataset(project, tokenizer)
    records = project.records["train"]
    assert len(data) == len(records)
    for index in (0, 7, len(data) - 1):
        sample, record = data[index], records[index]
        assert sample["image"].dtype == torch.uint8 and sample["image"].shape == (3, PACK_SIZE, PACK_SIZE)
        assert torch.equal(sample["image"], stored_image(project, "train", record["image_id"]))
        assert sample["question_ids"].dtype == torch.int64
        assert sample["question_ids"].tolist() == tokenizer.encode_question(record["command"])
        assert sample["answer_ids"].tolist() == tokenizer.encode_answer(record["answer"])
        for key in ("question_id", "image_id", "command", "answer", "command_type", "metadata"):
            assert sample[key] == record[key]
    assert data.images.image_size == PACK_SIZE and data.images.mean.shape == (3,) and data.images.std.shape == (3,)


def test_in_memory_gives_the_same_samples(project, tokenizer):
    from_file, in_ram = dataset(project, tokenizer), dataset(project, tokenizer, in_memory=True)
    indices = list(range(len(from_file)))
    for a, b in zip(from_file.__getitems__(indices), in_ram.__getitems__(indices)):
        assert torch.equal(a["image"], b["image"]) and a["question_id"] == b["question_id"]


def test_splits_share_no_image_and_a_foreign_image_is_an_error(project, tokenizer):
    image_sets = [{r["image_id"] for r in dataset(project, tokenizer, split).records} for split in SPLIT_SIZES]
    assert sum(len(s) for s in image_sets) == len(set().union(*image_sets)) == sum(SPLIT_SIZES.values())
    with pytest.raises(ValueError, match=r"val\.json: record 0: image 'img00\d\d' is not in .*train_images\.h5"):
        TrafficVQADataset(project.commands("val"), project.h5("train"), tokenizer)


def test_collate_pads_dynamically_and_stores_each_image_once(project, tokenizer):
    data = dataset(project, tokenizer)
    indices = [0, 1, 6, 12, 13]  # several questions share images (the file scatters them)
    samples = data.__getitems__(indices)
    batch = collate_questions(samples, pad_token_id=tokenizer.pad_token_id)
    distinct = list(dict.fromkeys(s["image_id"] for s in samples))
    assert batch.images.shape == (len(distinct), 3, PACK_SIZE, PACK_SIZE) and batch.images.dtype == torch.uint8
    assert len(distinct) < len(indices)
    for i, sample in enumerate(samples):
        assert torch.equal(batch.images[batch.image_index[i]], sample["image"])
        q, a = sample["question_ids"].tolist(), sample["answer_ids"].tolist()
        length = len(q) + len(a)
        assert batch.input_ids[i, :length].tolist() == q + a
        assert batch.input_ids[i, length:].eq(tokenizer.pad_token_id).all()
        assert batch.attention_mask[i].tolist() == [1] * length + [0] * (batch.input_ids.shape[1] - length)
        assert batch.prefix_lengths[i] == len(q) and batch.input_ids[i, len(q) - 1] == SEP
        assert batch.labels[i, len(q):length].tolist() == a
        assert batch.labels[i, :len(q)].eq(IGNORE_INDEX).all() and batch.labels[i, length:].eq(IGNORE_INDEX).all()
    longest = max(len(s["question_ids"]) + len(s["answer_ids"]) for s in samples)
    assert batch.input_ids.shape == (len(indices), longest)
    for key in ("image_index", "input_ids", "attention_mask", "prefix_lengths", "labels"):
        assert getattr(batch, key).dtype == torch.int64
    assert batch.question_id == [s["question_id"] for s in samples]
    assert batch.answer == [s["answer"] for s in samples]


def check_epoch(batches, image_rows, batch_size):
    flat = [q for batch in batches for q in batch]
    image_of_batch = {}
    for b, batch in enumerate(batches):
        assert len(batch) <= batch_size
        for q in batch:
            assert image_of_batch.setdefault(image_rows[q], b) == b  # all questions of an image together
    return flat


def test_grouped_sampler_keeps_images_together_and_is_seeded():
    rng = np.random.default_rng(0)
    image_rows = rng.integers(0, 40, size=300)  # uneven groups, scattered in file order
    sampler = GroupedBatchSampler(image_rows, batch_size=32, seed=3)
    first = list(sampler)
    assert sorted(check_epoch(first, image_rows, 32)) == list(range(300)) and len(sampler) == len(first)
    assert list(GroupedBatchSampler(image_rows, batch_size=32, seed=3)) == first
    sampler.set_epoch(1)
    assert list(sampler) != first and sorted(check_epoch(list(sampler), image_rows, 32)) == list(range(300))
    in_order = list(GroupedBatchSampler(image_rows, batch_size=32, shuffle=False))
    assert [image_rows[b[0]] for b in in_order] == sorted(image_rows[b[0]] for b in in_order)


def test_grouped_sampler_starts_an_epoch_at_a_given_batch():
    image_rows = np.random.default_rng(0).integers(0, 40, size=300)
    sampler = GroupedBatchSampler(image_rows, batch_size=32, seed=3)
    sampler.set_epoch(1)
    whole = list(sampler)
    sampler.set_epoch(1, start=4)  # a resumed run: the first 4 batches were trained before
    assert list(sampler) == whole[4:] and len(sampler) == len(whole) - 4
    sampler.set_epoch(2)  # the next epoch starts at its first batch again
    fresh = GroupedBatchSampler(image_rows, batch_size=32, seed=3)
    fresh.set_epoch(2)
    assert list(sampler) == list(fresh) and len(sampler) == len(fresh)


def test_grouped_sampler_splits_an_oversized_group():
    batches = list(GroupedBatchSampler([0] * 10 + [1] * 3, batch_size=4, shuffle=False))
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12]]


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_split_the_global_batches_of_one_process_at_world_size_times_the_batch(world_size):
    image_rows = np.random.default_rng(1).integers(0, 23, size=150)
    single = list(GroupedBatchSampler(image_rows, 16 * world_size, seed=5))
    shards = [list(GroupedBatchSampler(image_rows, 16, seed=5, rank=r, world_size=world_size))
              for r in range(world_size)]
    assert all(len(shard) == len(single) for shard in shards)  # the same number of steps on every rank
    for step, batch in enumerate(single):
        parts = [shard[step] for shard in shards]
        assert sum(parts, []) == batch  # rank by rank, the one process's batch in its order
        assert max(map(len, parts)) - min(map(len, parts)) <= 1 and min(map(len, parts)) >= 1


def test_too_few_questions_for_the_ranks_join_the_previous_step():
    shards = [list(GroupedBatchSampler([0, 0, 0, 1, 1, 1, 2], 3, shuffle=False, rank=r, world_size=2))
              for r in range(2)]
    assert shards == [[[0, 1, 2]], [[3, 4, 5, 6]]]  # the 7th question alone would leave rank 1 empty
    with pytest.raises(ValueError, match="1 questions cannot be split over 2 ranks"):
        list(GroupedBatchSampler([0], 4, rank=0, world_size=2))


@pytest.mark.parametrize("batch_size, world_size, seed", [(2, 2, None), (1, 6, 0), (1, 8, 1), (3, 4, 2)])
def test_no_rank_gets_an_empty_batch_when_a_step_closes_early(batch_size, world_size, seed):
    """A step closed with fewer questions than ranks (the next image's did not fit) left a rank an empty batch, on
    which collate stopped the run; every question still comes once, the ranks in step."""
    image_rows = [0, 1, 1, 1, 1] if seed is None else np.random.default_rng(seed).integers(0, 60, size=300)
    shards = [list(GroupedBatchSampler(image_rows, batch_size, seed=seed or 0, shuffle=seed is not None, rank=r,
                                       world_size=world_size)) for r in range(world_size)]
    assert len({len(shard) for shard in shards}) == 1 and all(batch for shard in shards for batch in shard)
    assert sorted(q for shard in shards for batch in shard for q in batch) == list(range(len(image_rows)))


def test_loader_with_two_workers_gives_the_batches_of_zero_workers(project, tokenizer):
    data = dataset(project, tokenizer, augment=AugmentConfig(), seed=11)
    data[0]  # the parent opens its HDF5 handle before the workers fork
    runs = []
    for workers in (0, 2):
        loader = build_loader(data, batch_size=12, shuffle=True, num_workers=workers, seed=7)
        epochs = []
        for epoch in (0, 1):
            set_epoch(loader, epoch)
            epochs.append(list(loader))
        runs.append(epochs)
    for epoch_0w, epoch_2w in zip(*runs):
        assert len(epoch_0w) == len(epoch_2w) > 1
        for a, b in zip(epoch_0w, epoch_2w):
            for field in dataclasses.fields(a):
                x, y = getattr(a, field.name), getattr(b, field.name)
                assert torch.equal(x, y) if torch.is_tensor(x) else x == y, field.name
    assert not torch.equal(runs[0][0][0].images, runs[0][1][0].images)  # a new draw each epoch


def test_dataset_pickles_without_its_hdf5_handle(project, tokenizer):
    data = dataset(project, tokenizer)
    data[0]
    assert data.images._file is not None
    clone = pickle.loads(pickle.dumps(data))
    assert clone.images._file is None
    assert torch.equal(clone[3]["image"], data[3]["image"])


def test_flip_mirrors_the_image_and_swaps_left_and_right_in_the_text(project, tokenizer):
    plain = dataset(project, tokenizer)
    mirrored = dataset(project, tokenizer, augment=MIRROR_ONLY)
    for index, record in enumerate(project.records["train"]):
        sample = mirrored[index]
        assert torch.equal(sample["image"], plain[index]["image"].flip(-1))
        assert sample["command"] == swap_left_right(record["command"])
        assert sample["question_ids"].tolist() == tokenizer.encode_question(sample["command"])
        assert sample["answer_ids"].tolist() == tokenizer.encode_answer(sample["answer"])
        if record["command"] == "Can the car safely turn left?":
            assert sample["command"] == "Can the car safely turn right?"
        if "right of way" in record["command"]:
            assert sample["command"] == record["command"]
        # The scene is mirrored: the image's left colour now fills the right side.
        left, _ = image_colours(int(record["image_id"].removeprefix("img")))
        right_quarter = sample["image"][:, :, -PACK_SIZE // 4:].permute(1, 2, 0).int()
        assert (right_quarter - torch.tensor(left)).abs().max() <= 8


def test_swap_left_right_keeps_case_and_other_words():
    assert swap_left_right("Is the bus LEFT of the car, or Right?") == "Is the bus RIGHT of the car, or Left?"
    assert swap_left_right("the leftmost lane; the rightmost one") == "the rightmost lane; the leftmost one"
    assert swap_left_right("right of way, bright, lefty") == "right of way, bright, lefty"
    assert swap_left_right("left") == "right"


def test_augmentation_is_per_image_and_epoch_and_shared_by_its_questions(project, tokenizer):
    data = dataset(project, tokenizer, augment=AugmentConfig(), seed=2)
    samples = data.__getitems__(list(range(len(data))))
    first_of_image, mirrored_of_image = {}, {}
    for sample, record in zip(samples, project.records["train"]):
        first = first_of_image.setdefault(sample["image_id"], sample)
        assert torch.equal(first["image"], sample["image"])  # one augmented image per (image, epoch)
        if "left" in record["command"]:  # the flip decision is the image's, for all its questions
            mirrored = sample["command"] != record["command"]
            assert mirrored_of_image.setdefault(sample["image_id"], mirrored) == mirrored
    assert set(mirrored_of_image.values()) == {False, True}  # hflip_prob 0.5 over 6 images, seed 2
    assert not torch.equal(samples[0]["image"], stored_image(project, "train", samples[0]["image_id"]))
    config = AugmentConfig(hue=0.01)
    assert sample_augment_params(config, 2, 0, 5) == sample_augment_params(config, 2, 0, 5)
    assert sample_augment_params(config, 2, 0, 5) != sample_augment_params(config, 2, 1, 5)
    assert sample_augment_params(config, 2, 0, 5) != sample_augment_params(config, 2, 0, 6)


def test_the_augmentation_moves_no_pixel_but_by_the_mirror():
    """The answers and the heads' targets come from the label boxes: the strongest jitter allowed leaves every object
    where it was, and a flip moves it to its mirror place (whose targets and text the dataset mirrors too)."""
    strongest = AugmentConfig(hflip_prob=0.5, brightness=0.5, contrast=0.5, saturation=0.5, hue=MAX_HUE)
    height, width = 16, 28
    flips = set()
    for row in range(40):
        y, x = row % height, (7 * row) % width
        image = torch.full((3, height, width), 40, dtype=torch.uint8)
        image[:, y, x] = torch.tensor([250, 240, 230], dtype=torch.uint8)  # one bright object
        params = sample_augment_params(strongest, seed=0, epoch=1, image_row=row)
        augmented = augment_image(image, params).int().sum(0)  # [H, W]
        flips.add(params.hflip)
        assert divmod(int(augmented.argmax()), width) == (y, width - 1 - x if params.hflip else x), params
    assert flips == {False, True}


def test_augment_config_rejects_colour_changing_jitter():
    with pytest.raises(ParamError, match="train.augment.hue"):
        build_config(AugmentConfig, {"hue": 0.2}, "train.augment")
    with pytest.raises(ParamError, match=r"train.augment.brightness: must be in \[0, 0.5\]"):
        build_config(AugmentConfig, {"brightness": 0.8}, "train.augment")


def test_a_file_that_is_not_a_packed_split_is_rejected_naming_it(project, tokenizer, tmp_path):
    not_hdf5 = tmp_path / "train_images.h5"
    not_hdf5.write_bytes(b"plain text")
    with pytest.raises(ValueError, match=r"train_images\.h5: not a readable HDF5 file"):
        TrafficVQADataset(project.commands("train"), not_hdf5, tokenizer)
    old_format = tmp_path / "old.h5"
    old_format.write_bytes(project.h5("train").read_bytes())
    with h5py.File(old_format, "r+") as f:
        f.attrs["format_version"] = 0
    with pytest.raises(ValueError, match=r"old\.h5: format_version 0, expected 2; re-run the pack_hdf5 stage"):
        TrafficVQADataset(project.commands("train"), old_format, tokenizer)


def test_targets_built_per_fetch_equal_the_ones_held_in_ram(project, tokenizer):
    heads = TargetTransform(4, FRAME)
    for augment in (None, MIRROR_ONLY):
        from_labels = dataset(project, tokenizer, augment=augment, targets=heads)
        in_ram = dataset(project, tokenizer, augment=augment, targets=heads, in_memory=True)
        assert in_ram.in_memory and not from_labels.in_memory
        indices = list(range(len(from_labels)))
        for a, b in zip(from_labels.__getitems__(indices), in_ram.__getitems__(indices)):
            np.testing.assert_array_equal(a["targets"], b["targets"])
            assert a["command"] == b["command"]


def test_a_bad_stored_label_fails_when_the_dataset_is_built_not_mid_epoch(project, tokenizer, tmp_path):
    damaged = tmp_path / "train_images.h5"
    damaged.write_bytes(project.h5("train").read_bytes())
    with h5py.File(damaged, "r+") as f:
        f["annotations"][3] = '{"name": "img.jpg", "labels": [{"category": "car", "box2d": {"x1": 0}}]}'
    TrafficVQADataset(project.commands("train"), damaged, tokenizer)  # without targets the labels are not read
    for in_memory in (False, True):
        with pytest.raises(ValueError, match=r"train_images.h5: annotation\[3\]"):
            TrafficVQADataset(project.commands("train"), damaged, tokenizer, in_memory=in_memory,
                              targets=TargetTransform(4, FRAME))


def test_head_targets_follow_the_image_and_its_mirror(project, tokenizer):
    plain = dataset(project, tokenizer, targets=TargetTransform(4, FRAME))
    mirrored = dataset(project, tokenizer, augment=MIRROR_ONLY, targets=TargetTransform(4, FRAME))
    assert "targets" not in dataset(project, tokenizer)[0]
    some_object = False
    for index in range(len(plain)):
        targets, flipped = plain[index]["targets"], mirrored[index]["targets"]
        assert targets.shape == (16, len(CHANNELS)) and targets.dtype == np.float32
        np.testing.assert_array_equal(flipped.reshape(4, 4, -1), targets.reshape(4, 4, -1)[:, ::-1])
        some_object |= bool(targets.any())
    assert some_object
    batch = collate_questions([plain[i] for i in range(6)])
    assert batch.targets.shape == (batch.images.shape[0], 16, len(CHANNELS))
    first_of_image = {image_id: i for i, image_id in reversed(list(enumerate(batch.image_id)))}
    for i in first_of_image.values():
        assert torch.equal(batch.targets[batch.image_index[i]], torch.from_numpy(plain[i]["targets"]))


def test_a_rectangular_image_and_its_targets_mirror_as_a_whole(project, tokenizer, tmp_path):
    native = project.copy_to(tmp_path / "native")
    native.pack_native()  # 48 x 32: left colour on the left 24 columns
    heads = TargetTransform((4, 6), FRAME)
    plain = dataset(native, tokenizer, targets=heads)
    mirrored = dataset(native, tokenizer, augment=MIRROR_ONLY, targets=heads)
    for index in range(len(plain)):
        image, flipped = plain[index]["image"], mirrored[index]["image"]
        assert image.shape == (3, PACK_SIZE, 48)
        assert torch.equal(flipped, image.flip(-1))
        left, right = image_colours(int(plain[index]["image_id"].removeprefix("img")))
        assert (flipped[:, :, :12].float().mean(dim=(1, 2)) - torch.tensor(right)).abs().max() <= 8
        targets = plain[index]["targets"]
        assert targets.shape == (24, len(CHANNELS))
        np.testing.assert_array_equal(mirrored[index]["targets"].reshape(4, 6, -1), targets.reshape(4, 6, -1)[:, ::-1])
    batch = collate_questions([plain[i] for i in range(6)])
    assert batch.images.shape[1:] == (3, PACK_SIZE, 48) and batch.targets.shape[1:] == (24, len(CHANNELS))


def test_only_a_dataset_that_jitters_imports_torchvision(project, tokenizer, tmp_path):
    """A flip needs no torchvision (answering imports none, a second or two of each stage's start); a dataset whose
    augmentation jitters imports its transforms when built, before the loader's workers fork from its process."""
    (tmp_path / "tokenizer.pkl").write_bytes(pickle.dumps(tokenizer))
    script = f"""
import pickle, sys
from vlm.data.augment import AugmentConfig
from vlm.data.dataset import MIRROR, TrafficVQADataset
tokenizer = pickle.loads(open({str(tmp_path / "tokenizer.pkl")!r}, "rb").read())
paths = {str(project.commands("train"))!r}, {str(project.h5("train"))!r}
TrafficVQADataset(*paths, tokenizer, augment=MIRROR).__getitems__([0, 1])
flipped = any(name.startswith("torchvision") for name in sys.modules)
TrafficVQADataset(*paths, tokenizer, augment=AugmentConfig())
print(flipped, any(name.startswith("torchvision") for name in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.split() == ["False", "True"], result.stdout + result.stderr
