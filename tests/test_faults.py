"""The fault battery, in process: a full disk, an unwritable folder, a damaged packed file, oversized images,
a model file replaced while it is read, temporaries left by a killed writer. docs/faults.md lists every fault
with the test that checks it; the real kills are in tests/test_kills.py.

A full disk is a small tmpfs when the tests run as root (CI and this project's machines) and an injected
``ENOSPC`` in the write path everywhere; an unwritable folder is a read-only tmpfs as root (root ignores
permission bits) and a ``chmod 555`` folder otherwise.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import struct
import subprocess
import threading
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import stages.generate_scenes
import stages.pack_hdf5
import vlm.checkpoint
import vlm.train
from tiny_project import FRAME_SIZE, TINY_MODEL, TINY_RUNTIME, paths_for, tiny_train_config
from vlm import checkpoint
from vlm.cli import run
from vlm.data.h5file import PackedImageReader, PackedImageWriter
from vlm.data.image import MAX_IMAGE_PIXELS, CorruptImageError, decode_image
from vlm.data.pack import PackConfig, PackRuntime, pack_dataset
from vlm.io import atomic_path, check_writable, iter_json_list, remove_stale_temporaries, write_json, write_json_list
from vlm.scenes.generate import ScenesConfig, ScenesRuntime, generate_synthetic
from vlm.train import train

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group("tiny_project")  # one worker builds the shared tiny project


# ------------------------------------------------------------------------------------------------ helpers


def _mount_tmpfs(folder: Path, options: str) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


def _umount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB filesystem (tmpfs; needs root)."""
    folder = tmp_path / "disk"
    if not _mount_tmpfs(folder, "size=1m"):
        pytest.skip("a tmpfs needs root; the injected-ENOSPC tests cover this machine")
    yield folder
    _umount(folder)


@pytest.fixture
def read_only(tmp_path):
    """A folder nothing can be written to: a read-only tmpfs as root, else a chmod 555 folder."""
    folder = tmp_path / "read-only"
    if _mount_tmpfs(folder, "ro,size=64k"):
        yield folder
        _umount(folder)
    else:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)


@pytest.fixture
def project(tiny_project):
    return tiny_project.root, tiny_project.processed


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _one_line_error(capsys, main) -> str:
    """What ``vlm.cli.run`` prints for a failing ``main``: exit 1 and one line on stderr (after any progress bars)."""
    with pytest.raises(SystemExit) as exit_info:
        run(main)
    assert exit_info.value.code == 1
    lines = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    assert lines[-1].startswith("error: ") and sum("error" in line for line in lines) == 1, lines
    return lines[-1]


class _FullDiskFile:
    """A file object whose writes fail as on a full disk."""

    def __init__(self, *args, **kwargs):
        pass

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------------------------------------ temporaries


def test_temporaries_of_a_killed_writer_are_removed_by_the_next_write(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid now belongs to no process
    out = tmp_path / "out.json"
    stale_file = tmp_path / f".out.json.{dead.pid}.x1y2.tmp"
    stale_file.write_text("half")
    stale_dir = tmp_path / f".out.json.{dead.pid}.z3.tmp"
    (stale_dir / "images").mkdir(parents=True)
    live = tmp_path / f".out.json.{os.getpid()}.w4.tmp"  # a writer that is still running
    live.write_text("busy")
    other = tmp_path / f".other.json.{dead.pid}.q5.tmp"
    other.write_text("not ours")
    write_json(out, {"a": 1})
    assert _files(tmp_path) == sorted([out.name, live.name, other.name])
    assert remove_stale_temporaries(tmp_path / "other.json") == [other]


def test_a_truncated_or_damaged_json_list_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "labels.json"
    write_json_list(path, [{"a": 1}, {"b": 2}, {"c": 3}])
    text = path.read_text()
    path.write_text(text[: text.index('{"c"')])  # a copy cut short
    with pytest.raises(ValueError, match=r"labels.json: line 3: the list ends without its closing '\]'"):
        list(iter_json_list(path))
    path.write_text(text.replace('{"b": 2}', '{"b": 2'))
    with pytest.raises(ValueError, match=r"labels.json: invalid JSON at line 3, column \d+: .*one item per line"):
        list(iter_json_list(path))
    path.write_text(json.dumps([{"a": 1}], indent=2))  # a valid list, but not one item per line
    with pytest.raises(ValueError, match=r"labels.json: invalid JSON at line 2"):
        list(iter_json_list(path))


# ------------------------------------------------------------------------------------------------ full disk


def test_full_disk_checkpoint_write_is_one_line_and_keeps_the_last_good_one(small_disk, capsys):
    path = small_disk / "vlm-last.pt"
    checkpoint.save(path, {"weights": torch.zeros(10_000)})  # 40 kB: fits
    before = path.read_bytes()
    big = {"weights": torch.zeros(1_000_000)}  # 4 MB: does not
    err = _one_line_error(capsys, lambda: checkpoint.save(path, big))
    assert f"cannot write {path}: No space left on device" in err
    assert path.read_bytes() == before and _files(small_disk) == [path.name]
    assert torch.equal(checkpoint.read(path)["weights"], torch.zeros(10_000))


def test_full_disk_during_training_stops_with_one_line_naming_the_checkpoint(project, small_disk, tmp_path,
                                                                             capsys, monkeypatch):
    _, processed = project
    paths = paths_for(processed, tmp_path)
    paths.checkpoints = small_disk
    (small_disk / "filler").write_bytes(b"\0" * (1024 * 1024 - 16 * 1024))  # less room than a checkpoint needs
    err = _one_line_error(capsys, lambda: train(TINY_MODEL, tiny_train_config(), paths, progress=False,
                                                frame_size=FRAME_SIZE, runtime=TINY_RUNTIME))
    assert re.search(rf"cannot write {small_disk}/vlm-[0-9a-f]{{16}}\.pt: No space left on device", err), err
    assert _files(small_disk) == ["filler"]  # no temporary left behind
    assert not paths.model.exists()


def test_full_disk_while_packing_keeps_the_previous_files(project, small_disk, capsys):
    root, processed = project
    raw = root / "data" / "raw"
    args = (raw / "labels.json", raw / "source.json", processed / "commands", small_disk)
    one = PackRuntime(workers=1)
    pack_dataset(*args, PackConfig(image_size=16), runtime=one)  # about 50 kB: fits
    before = {name: (small_disk / name).read_bytes() for name in _files(small_disk)}
    err = _one_line_error(capsys, lambda: pack_dataset(*args, PackConfig(image_size=128), runtime=one))
    assert "No space left on device" in err and str(small_disk / "train_images.h5") in err
    assert {name: (small_disk / name).read_bytes() for name in _files(small_disk)} == before
    assert len(PackedImageReader(small_disk / "train_images.h5")) > 0


def test_full_disk_while_rendering_names_the_output_folder(small_disk, capsys):
    out = small_disk / "raw"
    err = _one_line_error(capsys, lambda: generate_synthetic(ScenesConfig(num_images=40), out, progress=False,
                                                              runtime=ScenesRuntime(workers=2)))
    assert f"cannot write {out}: No space left on device" in err
    assert _files(small_disk) == []


class _RunsCode:
    """Pickled, it makes the unpickler call ``open(marker, "w")``: any code could stand in its place."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_a_checkpoint_that_would_run_code_is_refused_with_one_line(tmp_path, capsys):
    marker, path = tmp_path / "ran", tmp_path / "downloaded.pt"
    torch.save({"format_version": checkpoint.FORMAT_VERSION, "state_dict": {}, "payload": _RunsCode(marker)}, path)
    err = _one_line_error(capsys, lambda: checkpoint.read(path))
    assert f"{path}: refused: loading this checkpoint would run code (io.open)" in err
    assert not marker.exists()
    resume = tmp_path / "vlm-run.pt"  # a resume checkpoint goes through the same reader
    torch.save({"fingerprint": "run", "state": _RunsCode(marker)}, resume)
    with pytest.raises(ValueError, match="resume checkpoint would run code"):
        checkpoint.read_resume(resume, "run")
    assert not marker.exists()


def test_injected_enospc_in_a_checkpoint_write(tmp_path, monkeypatch, capsys):
    path = tmp_path / "vlm-last.pt"
    checkpoint.save(path, {"step": 1})
    before = path.read_bytes()
    monkeypatch.setattr(vlm.checkpoint, "open", _FullDiskFile, raising=False)
    err = _one_line_error(capsys, lambda: checkpoint.save(path, {"step": 2}))
    assert err == f"error: [Errno {errno.ENOSPC}] cannot write {path}: No space left on device"
    assert path.read_bytes() == before and _files(tmp_path) == [path.name]


def test_injected_enospc_while_packing(project, tmp_path, monkeypatch, capsys):
    root, processed = project
    raw = root / "data" / "raw"
    original = PackedImageWriter.append

    def append(self, *args):
        if len(self) == 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original(self, *args)

    monkeypatch.setattr(PackedImageWriter, "append", append)
    err = _one_line_error(capsys, lambda: pack_dataset(raw / "labels.json", raw / "source.json",
                                                        processed / "commands", tmp_path,
                                                        PackConfig(image_size=32), runtime=PackRuntime(workers=1)))
    assert err == f"error: [Errno {errno.ENOSPC}] cannot write {tmp_path / 'train_images.h5'}: No space left on device"
    assert _files(tmp_path) == []


# ------------------------------------------------------------------------------------------------ unwritable


def test_check_writable_names_the_folder(read_only):
    with pytest.raises(OSError, match=f"cannot write {read_only / 'a' / 'b.json'}: {read_only} is not writable"):
        check_writable(read_only / "a" / "b.json")
    assert _files(read_only) == []


def test_unwritable_outputs_fail_before_any_expensive_work(project, read_only, tmp_path, monkeypatch, capsys):
    root, processed = project
    raw = root / "data" / "raw"
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")

    def expensive(*args, **kwargs):
        raise AssertionError("expensive work started before the output folder was checked")

    monkeypatch.setattr(stages.pack_hdf5, "pack_dataset", expensive)
    err = _one_line_error(capsys, lambda: stages.pack_hdf5.main([
        "--params", str(tmp_path / "params.yaml"), "--raw", str(raw), "--commands-dir", str(processed / "commands"),
        "--out", str(read_only), "--metrics", str(tmp_path / "pack.json")]))
    assert "is not writable" in err and str(read_only) in err

    monkeypatch.setattr(stages.generate_scenes, "generate_scenes", expensive)
    err = _one_line_error(capsys, lambda: stages.generate_scenes.main([
        "--params", str(tmp_path / "params.yaml"), "--out", str(read_only / "raw"),
        "--metrics", str(tmp_path / "scenes.json"), "--statistics", "vlm/scenes/bdd100k_statistics.json"]))
    assert "is not writable" in err

    monkeypatch.setattr(vlm.train, "build_vlm", expensive)
    paths = paths_for(processed, tmp_path)
    paths.model = read_only / "models" / "vlm.pt"
    err = _one_line_error(capsys, lambda: train(TINY_MODEL, tiny_train_config(), paths, progress=False,
                                                frame_size=FRAME_SIZE, runtime=TINY_RUNTIME))
    assert f"cannot write {paths.model}: {read_only} is not writable" in err


def test_an_impossible_image_size_fails_before_packing(project, tmp_path, monkeypatch, capsys):
    root, processed = project
    params = (ROOT / "params.yaml").read_text().replace("image_size: 128", "image_size: 100", 1)
    assert "image_size: 100" in params
    (tmp_path / "params.yaml").write_text(params)
    monkeypatch.setattr(stages.pack_hdf5, "pack_dataset", lambda *a, **k: pytest.fail("packing started"))
    err = _one_line_error(capsys, lambda: stages.pack_hdf5.main([
        "--params", str(tmp_path / "params.yaml"), "--raw", str(root / "data" / "raw"),
        "--commands-dir", str(processed / "commands"), "--out", str(tmp_path), "--metrics", str(tmp_path / "m.json")]))
    assert err == "error: model.siglip.patch_size: must divide pack.image_size (100 % 16 = 4)"
    (tmp_path / "params.yaml").write_text(params.replace("image_size: 100", "image_size: 144", 1))
    err = _one_line_error(capsys, lambda: stages.pack_hdf5.main([  # 9 patches high: no whole 2 x 2 groups
        "--params", str(tmp_path / "params.yaml"), "--raw", str(root / "data" / "raw"),
        "--commands-dir", str(processed / "commands"), "--out", str(tmp_path), "--metrics", str(tmp_path / "m.json")]))
    assert err == ("error: pack.image_size: must be a multiple of the patch size x model.pixel_shuffle (16 x 2 = 32), "
                   "got 144; or set model.pixel_shuffle: 1")
    (tmp_path / "params.yaml").write_text(params.replace("vision: siglip", "vision: SigLIP", 1))
    err = _one_line_error(capsys, lambda: stages.pack_hdf5.main([  # packed 228 wide as "blind", then train stopped
        "--params", str(tmp_path / "params.yaml"), "--raw", str(root / "data" / "raw"),
        "--commands-dir", str(processed / "commands"), "--out", str(tmp_path), "--metrics", str(tmp_path / "m.json")]))
    assert err == "error: model.vision: must be one of 'siglip', 'none', got 'SigLIP'"


# ------------------------------------------------------------------------------------------------ damaged files


def _chunk_offset(path: Path, row: int) -> int:
    with h5py.File(path, "r") as f:
        return f["images"].id.get_chunk_info(row).byte_offset


def test_an_image_damaged_in_the_middle_of_the_file_fails_naming_it(project, tmp_path):
    _, processed = project
    damaged = tmp_path / "val_images.h5"
    shutil.copy(processed / "val_images.h5", damaged)
    reader = PackedImageReader(damaged)
    row = len(reader) // 2
    with open(damaged, "r+b") as f:
        f.seek(_chunk_offset(damaged, row) + 100)
        f.write(b"\0" * 64)
    out = np.empty((1, reader.image_size, reader.image_size, 3), dtype=np.uint8)
    reader.read_into([row - 1], out)  # its neighbours are fine
    with pytest.raises(ValueError, match=rf"{damaged}: image {row} \({reader.image_ids[row]}\) does not match its "
                                         r"checksum; the file is damaged: re-run the pack_hdf5 stage"):
        reader.read_into([row], out)


@pytest.mark.parametrize("seed", range(12))
def test_damage_anywhere_is_an_error_or_harmless_never_wrong_pixels(project, tmp_path, seed):
    """Random bytes over a random stretch of the file: opening or reading it fails with a ValueError naming
    the file, or every image read is the original (the damage hit unused bytes)."""
    _, processed = project
    original = processed / "val_images.h5"
    damaged = tmp_path / "val_images.h5"
    shutil.copy(original, damaged)
    rng = np.random.default_rng(seed)
    size = damaged.stat().st_size
    length = int(rng.integers(1, 512))
    offset = int(rng.integers(0, size - length))
    with open(damaged, "r+b") as f:
        f.seek(offset)
        f.write(rng.integers(0, 256, length, dtype=np.uint8).tobytes())
    reference = PackedImageReader(original)
    expected = reference.read_into(list(range(len(reference))),
                                   np.empty((len(reference), reference.image_size, reference.image_size, 3), np.uint8))
    try:
        reader = PackedImageReader(damaged)
        images = reader.read_into(list(range(len(reader))), np.empty_like(expected))
    except ValueError as e:
        assert str(damaged) in str(e)
        return
    assert reader.image_ids == reference.image_ids and np.array_equal(images, expected)


# ------------------------------------------------------------------------------------------------ oversized images


def write_png_bomb(path: Path, width: int, height: int) -> None:
    """A grayscale PNG of ``width x height`` zero pixels: a few hundred kB that decode to ``width * height`` bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor = zlib.compressobj(9)
    row = b"\0" * (width + 1)  # filter byte + pixels
    rows_per_block = max(1, (1 << 24) // len(row))
    data = b"".join(compressor.compress(row * min(rows_per_block, height - start))
                    for start in range(0, height, rows_per_block)) + compressor.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", data) + chunk(b"IEND", b""))


@pytest.mark.parametrize("width, height", [(20_000, 20_000), (8_000, 8_000)])
def test_oversized_images_are_refused_from_their_header(tmp_path, width, height):
    """20,000 x 20,000 is past PIL's own limit; 8,000 x 8,000 (64 M pixels) only past ours."""
    bomb = tmp_path / "bomb.png"
    write_png_bomb(bomb, width, height)
    assert bomb.stat().st_size < 2_000_000 and width * height > MAX_IMAGE_PIXELS
    with pytest.raises(CorruptImageError, match=rf"{bomb}: image .*refused: more than {MAX_IMAGE_PIXELS:,} pixels"):
        decode_image(bomb, 32)


def test_a_bomb_among_the_images_fails_packing_naming_it(project, tmp_path, capsys):
    root, processed = project
    raw = tmp_path / "raw"
    shutil.copytree(root / "data" / "raw", raw)
    source = json.loads((raw / "source.json").read_text())
    (raw / "source.json").write_text(json.dumps({**source, "image_dir": str(raw / "images")}))
    victim = sorted((raw / "images").iterdir())[3]
    write_png_bomb(victim, 20_000, 20_000)  # a PNG under a .jpg name: PIL reads the content
    err = _one_line_error(capsys, lambda: pack_dataset(raw / "labels.json", raw / "source.json",
                                                        processed / "commands", tmp_path / "out",
                                                        PackConfig(image_size=32), runtime=PackRuntime(workers=1)))
    assert f"{victim}: image refused" in err and "set pack.skip_corrupt: true to skip it" in err


# ------------------------------------------------------------------------------------------------ concurrent use


def test_a_model_file_replaced_while_it_is_read_is_always_whole(tmp_path):
    """One thread keeps replacing the model file (as training does), another keeps loading it: every load
    gets one of the versions, never a torn file."""
    path = tmp_path / "vlm.pt"
    versions = [{"version": v, "weights": torch.full((50_000,), float(v))} for v in range(2)]
    checkpoint.save(path, versions[0])
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            i += 1
            checkpoint.save(path, versions[i % 2])

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        seen = set()
        for _ in range(200):
            loaded = checkpoint.read(path)
            assert torch.equal(loaded["weights"], versions[loaded["version"]]["weights"])
            seen.add(loaded["version"])
    finally:
        stop.set()
        thread.join()
    assert seen == {0, 1}
    assert _files(tmp_path) == ["vlm.pt"]


def test_atomic_path_leaves_the_old_output_when_the_body_fails(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(out) as tmp:
        tmp.write_text("new, half")
        raise RuntimeError("killed")
    assert out.read_text() == "old" and _files(tmp_path) == ["out.txt"]


def test_a_folder_output_is_replaced_whole_never_half_deleted(tmp_path, monkeypatch):
    """The old folder is renamed aside and then deleted (a kill leaves it whole or gone; deleted in place, a kill
    left part of it, which looked whole); a failed move puts it back."""
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "labels.json").write_text("old")
    rmtree = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda p, **kw: rmtree(p, **kw) if Path(p) != folder else pytest.fail(
        f"{p} deleted in place"))
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        (tmp / "labels.json").write_text("new")
    assert (folder / "labels.json").read_text() == "new" and _files(tmp_path) == ["raw"]
    replace = os.replace

    def failing_move_of_the_new_folder(source, target):
        if Path(target) == folder and (Path(source) / "labels.json").read_text() == "newer":
            raise OSError(errno.EIO, "I/O error")
        replace(source, target)

    monkeypatch.setattr(os, "replace", failing_move_of_the_new_folder)
    with pytest.raises(OSError, match="I/O error"), atomic_path(folder) as tmp:
        tmp.mkdir()
        (tmp / "labels.json").write_text("newer")
    assert (folder / "labels.json").read_text() == "new" and _files(tmp_path) == ["raw"]


def test_a_file_output_named_after_a_folder_keeps_the_folder(tmp_path):
    """A mistyped output path (``--out metrics`` for a JSON file) stops with one line; the folder stays whole."""
    folder = tmp_path / "metrics"
    (folder / "kept.json").parent.mkdir()
    (folder / "kept.json").write_text("{}")
    with pytest.raises(IsADirectoryError, match=r"cannot write .*metrics: it is a folder, and this output is a file"):
        write_json(folder, {"a": 1})
    assert (folder / "kept.json").read_text() == "{}" and _files(tmp_path) == ["metrics"]
    with atomic_path(folder) as tmp:  # a folder output replaces the folder, as before
        tmp.mkdir()
        (tmp / "new.json").write_text("[]")
    assert _files(folder) == ["new.json"]
