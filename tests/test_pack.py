"""pack_hdf5: layout, statistics, byte-identical output, corrupt images, split checks, the stage script."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import typing
import zlib
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from PIL import Image

from tiny_project import PACK_SIZE, SPLIT_SIZES, build_project, image_colours, write_jpeg
from vlm.config import ParamError, build_config
from vlm.data.dataset import TrafficVQADataset
from vlm.data.h5file import PackedImageReader
from vlm.data.image import CorruptImageError, decode_image, letterbox, native_width
from vlm.data.pack import PackConfig, PackRuntime, _decode_in_order
from vlm.models.image_size import VISION, check_image_keys, image_side_multiple
from vlm.models.paligemma import PaliGemmaConfig


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path):
    return build_project(tmp_path, frames="colours", pack=False)


def test_packed_layout_ids_annotations_and_pixels(project):
    metrics = project.pack()
    frames = {f["name"].removesuffix(".jpg"): f for f in json.loads(project.labels.read_text())}
    for split, count in SPLIT_SIZES.items():
        expected_ids = sorted({r["image_id"] for r in project.records[split]})
        with h5py.File(project.h5(split), "r") as f:
            images = f["images"]
            assert images.dtype == np.uint8 and images.shape == (count, PACK_SIZE, PACK_SIZE, 3)
            assert images.chunks == (1, PACK_SIZE, PACK_SIZE, 3) and images.compression is None
            assert list(f["image_ids"].asstr()[:]) == expected_ids
            annotations = list(f["annotations"].asstr()[:])
            assert [json.loads(a) for a in annotations] == [frames[i] for i in expected_ids]
            assert all(a == json.dumps(json.loads(a), sort_keys=True, separators=(",", ":")) for a in annotations)
            assert f.attrs["image_size"] == PACK_SIZE and f.attrs["format_version"] == 2
            assert f["checksums"].dtype == np.uint32
            assert f["checksums"][:].tolist() == [zlib.crc32(image.tobytes()) for image in images[:]]
            assert f.attrs["split"] == split
            assert f["metadata/mean"].dtype == np.float32 and f["metadata/mean"].shape == (3,)
            # The squash keeps the whole width: left quarter shows the left colour, right quarter the right.
            index = int(expected_ids[0].removeprefix("img"))
            left, right = image_colours(index)
            first = images[0].astype(int)
            assert np.abs(first[:, : PACK_SIZE // 4] - left).max() <= 8
            assert np.abs(first[:, -PACK_SIZE // 4:] - right).max() <= 8
        assert metrics["splits"][split] == {"images": count, "skipped": 0, "bytes": project.h5(split).stat().st_size}
    assert metrics["images"] == sum(SPLIT_SIZES.values()) and metrics["images_per_s"] > 0


def test_native_aspect_stores_the_frames_aspect_s_high(project):
    metrics = project.pack_native()  # 96 x 64 frames at 32 px high: 48 wide, a multiple of 16
    assert metrics["image_size"] == PACK_SIZE and metrics["image_width"] == 48
    for split, count in SPLIT_SIZES.items():
        with h5py.File(project.h5(split), "r") as f:
            images = f["images"]
            assert images.shape == (count, PACK_SIZE, 48, 3) and images.chunks == (1, PACK_SIZE, 48, 3)
            assert f.attrs["image_size"] == PACK_SIZE
            index = int(f["image_ids"].asstr()[0].removeprefix("img"))
            left, right = image_colours(index)
            first = images[0].astype(int)
            assert np.abs(first[:, :12] - left).max() <= 8 and np.abs(first[:, -12:] - right).max() <= 8
        reader = PackedImageReader(project.h5(split))
        assert (reader.image_size, reader.image_width) == (PACK_SIZE, 48)
        assert reader.read_into([0], np.empty((1, PACK_SIZE, 48, 3), np.uint8)).shape == (1, PACK_SIZE, 48, 3)
    square = project.pack()  # the same frames square: the key is left out, the files as they always were
    assert "image_width" not in square and PackedImageReader(project.h5("train")).image_width == PACK_SIZE


def test_native_width_rounds_the_frames_aspect_to_the_models_multiple(tmp_path):
    assert native_width((1280, 720), 128, 32) == 224  # the defaults: patch 16 x pixel shuffle 2, 8 x 14 patches
    assert native_width((1280, 720), 32, 16) == 64
    assert native_width((640, 480), 128, 32) == 160  # 4:3
    assert native_width((720, 1280), 128, 32) == 64  # portrait
    assert native_width((100, 1000), 32, 16) == 16  # never narrower than one multiple
    (tmp_path / "source.json").write_text(json.dumps({"image_dir": "images"}))
    with pytest.raises(ValueError, match=r"source\.json: pack.aspect native needs the frames' positive 'width'"):
        PackConfig(aspect="native").image_width(tmp_path / "source.json", 32)
    with pytest.raises(ParamError, match="pack.aspect: must be one of 'square', 'native', got 'wide'"):
        build_config(PackConfig, {"aspect": "wide"}, "pack")


def test_a_typo_in_a_model_key_the_pack_stage_reads_stops_it():
    """Checked as the model checks them, before packing: not after it, when the training stops on them."""
    assert image_side_multiple({"pixel_shuffle": 2}) == 32 and image_side_multiple({"vision": "none"}) == 1
    for model, message in [({"vision": "SigLIP"}, "model.vision: must be one of 'siglip', 'none', got 'SigLIP'"),
                           ({"pixel_shuffle": 0}, "model.pixel_shuffle: must be an integer >= 1, got 0"),
                           ({"siglip": {"patch_size": 1.5}}, "model.siglip.patch_size: must be an integer >= 1")]:
        with pytest.raises(ParamError, match=re.escape(message)):
            check_image_keys(model)
    assert typing.get_args(typing.get_type_hints(PaliGemmaConfig)["vision"]) == VISION  # the values the model takes


def test_letterbox_pads_to_the_aspect_without_stretching():
    photo = Image.new("RGB", (40, 30), (255, 0, 0))  # 4:3 onto 16:9: black bars left and right
    wide = letterbox(photo, 16 / 9)
    assert wide.size == (53, 30)
    pixels = np.asarray(wide)
    assert (pixels[:, :6] == 0).all() and (pixels[:, -7:] == 0).all() and (pixels[:, 6:46] == (255, 0, 0)).all()
    tall = letterbox(Image.new("RGB", (30, 60)), 16 / 9)  # portrait: bars left and right too
    assert tall.size == (107, 60)
    flat = letterbox(Image.new("RGB", (200, 50)), 16 / 9)  # wider than 16:9: bars above and below
    assert flat.size == (200, 112)
    assert letterbox(photo, 4 / 3) is photo


def test_a_photo_letterboxed_to_a_size_is_resized_before_it_is_padded():
    """A panorama onto 16:9 at 64 x 36: the same picture as padding it at full size and resizing, without the full-size
    padded frame (2,000 x 1,125 here; a 20 MP panorama's would take a gigabyte)."""
    pixels = np.repeat(np.repeat(_scene_pixels(), 10, axis=0), 20, axis=1)[:100]  # 100 x 1,920, wider than 16:9
    photo = Image.fromarray(np.ascontiguousarray(pixels))
    direct = np.asarray(letterbox(photo, 16 / 9, (64, 36)), dtype=np.float64)
    padded = np.asarray(letterbox(photo, 16 / 9).resize((64, 36), Image.Resampling.BICUBIC), dtype=np.float64)
    assert direct.shape == padded.shape == (36, 64, 3)
    assert (direct[:16] == 0).all() and (direct[-16:] == 0).all()  # bars above and below: the picture 64 x 3
    assert np.abs(direct - padded).mean() < 4


def test_mean_std_from_train_pixels_in_every_split(project):
    project.pack()
    with h5py.File(project.h5("train"), "r") as f:
        pixels = f["images"][:].reshape(-1, 3).astype(np.float64) / 255.0
        train_mean, train_std = f["metadata/mean"][:], f["metadata/std"][:]
    np.testing.assert_allclose(train_mean, pixels.mean(0), rtol=1e-6)
    np.testing.assert_allclose(train_std, pixels.std(0), rtol=1e-5)
    for split in ("val", "test"):
        with h5py.File(project.h5(split), "r") as f:
            np.testing.assert_array_equal(f["metadata/mean"][:], train_mean)
            np.testing.assert_array_equal(f["metadata/std"][:], train_std)


def test_packing_twice_is_byte_identical_whatever_the_worker_count(project):
    project.pack(workers=1)
    first = {split: sha256(project.h5(split)) for split in SPLIT_SIZES}
    time.sleep(1.1)  # HDF5 object timestamps have 1 s resolution: they would differ now
    project.pack(workers=2, chunksize=1)
    assert {split: sha256(project.h5(split)) for split in SPLIT_SIZES} == first


def test_decode_draft_downscale_matches_full_resolution_reference(tmp_path):
    # A 1280x720 JPEG with detail at several scales; the draft path must stay close to a
    # full-resolution Lanczos resize (the quality reference) while decoding at 1/4 scale.
    y, x = np.mgrid[0:720, 0:1280]
    pixels = np.stack([127 + 100 * np.sin(x / 37.0), 127 + 100 * np.cos(y / 23.0),
                       127 + 100 * np.sin((x + y) / 61.0)], axis=-1)
    pixels[300:420, 100:400] = (250, 30, 30)
    path = tmp_path / "scene.jpg"
    Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
    packed = decode_image(path, 128).astype(np.float64)
    with Image.open(path) as image:
        reference = np.asarray(image.convert("RGB").resize((128, 128), Image.Resampling.LANCZOS), dtype=np.float64)
    psnr = 10 * np.log10(255.0 ** 2 / np.mean((packed - reference) ** 2))
    assert packed.shape == (128, 128, 3)
    assert psnr > 35.0


def _scene_pixels() -> np.ndarray:
    """A 64 x 96 uint8 RGB frame with a bright block left of centre and a gradient: no symmetry to hide a turn."""
    y, x = np.mgrid[0:64, 0:96]
    pixels = np.stack([x * 2, y * 3, (x + y) % 200], axis=-1).astype(np.uint8)
    pixels[10:30, 5:25] = (250, 250, 40)
    return pixels


def test_16_bit_greys_decode_as_their_8_bit_image_and_32_bit_pixels_are_refused(tmp_path):
    """PIL's convert("RGB") clips 16-bit greys at 255 (a white frame): they keep their top 8 bits instead."""
    grey = _scene_pixels()[..., 0].astype(np.uint16) * 257  # 0..255 spread over 0..65535
    Image.fromarray(grey).save(tmp_path / "grey16.png")
    Image.fromarray((grey >> 8).astype(np.uint8)).save(tmp_path / "grey8.png")
    assert Image.open(tmp_path / "grey16.png").mode.startswith("I;16")
    np.testing.assert_array_equal(decode_image(tmp_path / "grey16.png", 32, image_width=48),
                                  decode_image(tmp_path / "grey8.png", 32, image_width=48))
    for mode, values in (("I", grey.astype(np.int32)), ("F", grey.astype(np.float32) / 65535)):
        Image.fromarray(values, mode).save(tmp_path / f"{mode}.tif")
        with pytest.raises(CorruptImageError, match=rf"{mode}\.tif: 32-bit .* pixels \(PIL mode {mode}\)"):
            decode_image(tmp_path / f"{mode}.tif", 32)


def test_a_photo_is_turned_upright_by_its_exif_orientation_and_packing_keeps_stored_pixels(tmp_path):
    """A camera held sideways stores the pixels turned and says so in EXIF (orientation 6: turn 90 degrees
    clockwise to view); predict's processor shows the model the photo as a viewer does, packing keeps the stored
    pixels, in which BDD100K's boxes are."""
    pixels = _scene_pixels()
    Image.fromarray(pixels).save(tmp_path / "plain.png")
    stored = Image.fromarray(np.rot90(pixels))  # 96 x 64 stored, 64 x 96 viewed
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    stored.save(tmp_path / "sideways.png", exif=exif)
    upright = decode_image(tmp_path / "sideways.png", 64, image_width=96, upright=True)
    np.testing.assert_array_equal(upright, decode_image(tmp_path / "plain.png", 64, image_width=96))
    np.testing.assert_array_equal(decode_image(tmp_path / "sideways.png", 96, image_width=64), np.rot90(pixels))


def test_a_jpeg_over_the_pixel_limit_decodes_at_its_draft_size_and_another_format_is_refused(tmp_path, monkeypatch):
    """The limit bounds the pixels decoded: a JPEG decodes at 1/2 to 1/8 of its size when that is enough."""
    monkeypatch.setattr("vlm.data.image.MAX_IMAGE_PIXELS", 20_000)
    photo = Image.fromarray(np.repeat(np.repeat(_scene_pixels(), 4, axis=0), 4, axis=1))  # 384 x 256: 98,304 pixels
    photo.save(tmp_path / "big.jpg", quality=95)
    photo.save(tmp_path / "big.png")
    assert decode_image(tmp_path / "big.jpg", 32, image_width=48).shape == (32, 48, 3)  # drafted to 48 x 32
    with pytest.raises(CorruptImageError, match=r"big\.png: image of 384 x 256 pixels refused: more than 20,000"):
        decode_image(tmp_path / "big.png", 32, image_width=48)


@pytest.mark.parametrize("content", [b"", b"not an image at all", "truncated"])
def test_corrupt_image_fails_naming_the_file_and_leaves_no_output(project, content):
    path = project.image_dir / "img0001.jpg"
    data = path.read_bytes()[:200] if content == "truncated" else content
    path.write_bytes(data)
    with pytest.raises(CorruptImageError, match=r"img0001\.jpg.*skip_corrupt"):
        project.pack()
    assert not project.h5("train").exists()
    assert list(project.processed.glob("*.h5")) == [] and list(project.processed.glob(".*tmp")) == []


def test_skip_corrupt_counts_the_image_and_the_dataset_drops_its_questions(project):
    (project.image_dir / "img0001.jpg").write_bytes(b"garbage")
    (project.image_dir / "img0007.jpg").write_bytes((project.image_dir / "img0006.jpg").read_bytes()[:300])
    metrics = project.pack(skip_corrupt=True)
    assert metrics["skipped"] == 2
    assert metrics["splits"]["train"]["skipped"] == 1 and metrics["splits"]["val"]["skipped"] == 1
    with h5py.File(project.h5("train"), "r") as f:
        assert "img0001" not in list(f["image_ids"].asstr()[:])
        assert list(f["skipped_image_ids"].asstr()[:]) == ["img0001"]
        assert f["images"].shape[0] == SPLIT_SIZES["train"] - 1
    dataset = TrafficVQADataset(project.commands("train"), project.h5("train"), project.tokenizer())
    assert dataset.num_dropped == 5 and len(dataset) == len(project.records["train"]) - 5
    assert "img0001" not in {r["image_id"] for r in dataset.records}


def test_an_image_in_two_splits_is_rejected_before_decoding(project):
    val = json.loads(project.commands("val").read_text())
    val[0]["image_id"] = project.records["train"][0]["image_id"]
    project.commands("val").write_text(json.dumps(val))
    with pytest.raises(ValueError, match="both the train and the val commands"):
        project.pack()


def test_missing_frame_or_file_is_a_clear_error(project):
    (project.image_dir / "img0003.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 image file\(s\) of the train split missing.*img0003\.jpg"):
        project.pack()
    write_jpeg(project.image_dir / "img0003.jpg", 3)
    frames = [f for f in json.loads(project.labels.read_text()) if f["name"] != "img0008.jpg"]
    project.labels.write_text(json.dumps(frames))
    with pytest.raises(ValueError, match="image 'img0008' has no frame"):
        project.pack()


def test_decoding_keeps_a_bounded_number_of_chunks_in_flight():
    class Result:
        def __init__(self, value):
            self.value = value

        def result(self):
            pool.pending -= 1
            return self.value

    class CountingPool:
        pending = most_pending = 0

        def submit(self, fn, chunk, *args):
            self.pending += 1
            self.most_pending = max(self.most_pending, self.pending)
            return Result([f"{path}!" for path in chunk])

    pool = CountingPool()
    paths = [f"p{i}" for i in range(100)]
    runtime = PackRuntime(workers=2, chunksize=3)
    results = list(_decode_in_order(paths, PackConfig(), pool, runtime))
    assert results == [f"{p}!" for p in paths]  # in order
    assert pool.most_pending == 2 * runtime.num_workers


def test_a_decoding_process_that_dies_stops_the_pack_with_an_error(tmp_path):
    """A worker killed (the OOM killer, say) fails the pack with one line, not a wait for its chunk forever."""
    from vlm.data.pack import start_decode_pool

    pool = start_decode_pool(2)
    try:
        with pytest.raises(BrokenProcessPool):
            pool.submit(os._exit, 1).result()  # a worker dies
        paths = [str(tmp_path / f"img{i}.jpg") for i in range(8)]
        with pytest.raises(ChildProcessError, match="a decoding process died .* lower runtime.pack.workers"):
            list(_decode_in_order(paths, PackConfig(), pool, PackRuntime(workers=2, chunksize=2)))
    finally:
        pool.shutdown(cancel_futures=True)


def test_pack_config_errors_name_the_key():
    with pytest.raises(ParamError, match="pack.image_size"):
        build_config(PackConfig, {"image_size": 8}, "pack")
    with pytest.raises(ParamError, match="pack.resample"):
        build_config(PackConfig, {"resample": "nearest"}, "pack")
    with pytest.raises(ParamError, match="pack.colour"):
        build_config(PackConfig, {"colour": True}, "pack")
    with pytest.raises(ParamError, match="runtime.pack.workers: must be >= 0"):
        build_config(PackRuntime, {"workers": -1}, "runtime.pack")
    with pytest.raises(ParamError, match="runtime.pack.chunksize: must be >= 1, got 0"):
        build_config(PackRuntime, {"chunksize": 0}, "runtime.pack")


def test_stage_script_writes_files_and_metrics(project, monkeypatch):
    from stages.pack_hdf5 import main

    (project.root / "params.yaml").write_text(yaml.safe_dump({"pack": {"image_size": PACK_SIZE, "aspect": "square"},
                                                                     "model": {"siglip": {"patch_size": 8}},
                                                                     "runtime": {"pack": {"workers": 1}}}))
    monkeypatch.chdir(project.root)
    main(["--raw", "data/raw", "--commands-dir", "data/processed/commands", "--out", "data/processed",
          "--metrics", "metrics/pack.json"])
    metrics = json.loads((project.root / "metrics" / "pack.json").read_text())
    assert metrics["images"] == sum(SPLIT_SIZES.values())
    assert all(project.h5(split).is_file() for split in SPLIT_SIZES)


def test_stage_script_packs_native_aspect_to_patch_times_pixel_shuffle(project, monkeypatch):
    from stages.pack_hdf5 import main

    project.source.write_text(json.dumps(json.loads(project.source.read_text()) | {"width": 1280, "height": 720}))
    (project.root / "params.yaml").write_text(yaml.safe_dump({
        "pack": {"image_size": 64, "aspect": "native"}, "model": {"siglip": {"patch_size": 8}, "pixel_shuffle": 2},
        "runtime": {"pack": {"workers": 1}}}))
    monkeypatch.chdir(project.root)
    main(["--raw", "data/raw", "--commands-dir", "data/processed/commands", "--out", "data/processed",
          "--metrics", "metrics/pack.json"])
    metrics = json.loads((project.root / "metrics" / "pack.json").read_text())
    assert (metrics["image_size"], metrics["image_width"]) == (64, 112)  # 64 * 16/9 = 113.8 -> 7 x 16
    assert PackedImageReader(project.h5("train")).image_width == 112
