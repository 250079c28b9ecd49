"""The packed-image HDF5 format (its layout, and why a re-run is byte-identical: docs/architecture.md, pack_hdf5), the
one place that knows it. Images are raw chunks (``write_direct_chunk``/``read_direct_chunk``): a read is one ``pread``
into the caller's buffer, then its CRC-32 (about 12 us for 128 px, a fraction of the read)."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import h5py
import numpy as np

from vlm.io import existing_file

FORMAT_VERSION = 2  # 2: checksums
LIBVER = ("v110", "v110")  # pinned: a newer HDF5 library writes the same bytes (and older readers can open them)
STRING_DTYPE = h5py.string_dtype("utf-8")


class PackedImageWriter:
    """Streams images into a new packed HDF5 file (only the id and annotation strings are held until ``finish``
    writes them and the stats); as a context manager, an error before ``finish`` closes the half-written file."""

    def __init__(self, path: str | os.PathLike, image_size: int, capacity: int, *, split: str, resample: str,
                 image_width: int | None = None):
        """Images of ``image_size`` (the height) x ``image_width`` (None: square) pixels."""
        self.path = Path(path)
        self.image_size = image_size
        self.image_width = image_width or image_size
        self._file = h5py.File(self.path, "w", libver=LIBVER, track_order=False)
        self._file.attrs.update(format_version=FORMAT_VERSION, image_size=image_size, split=split, resample=resample)
        shape = (image_size, self.image_width, 3)
        self._images = self._file.create_dataset(
            "images", shape=(capacity, *shape), maxshape=(None, *shape), dtype=np.uint8,
            chunks=(1, *shape), track_times=False)
        self._image_ids: list[str] = []
        self._annotations: list[str] = []
        self._checksums: list[int] = []

    def __len__(self) -> int:
        return len(self._image_ids)

    def __enter__(self) -> PackedImageWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._file.id.valid:  # not finished
            self._file.close()

    def append(self, image_id: str, image: np.ndarray, annotation: str) -> None:
        """Store ``image`` (uint8 ``[S, W, 3]``) as the next row."""
        expected = (self.image_size, self.image_width, 3)
        if image.shape != expected or image.dtype != np.uint8:
            raise ValueError(f"{image_id}: expected a uint8 image of shape {expected}, "
                             f"got {image.dtype} {image.shape}")
        row = len(self._image_ids)
        if row >= self._images.shape[0]:
            self._images.resize(row + 1, axis=0)
        data = np.ascontiguousarray(image).tobytes()
        self._images.id.write_direct_chunk((row, 0, 0, 0), data)
        self._checksums.append(zlib.crc32(data))
        self._image_ids.append(image_id)
        self._annotations.append(annotation)

    def finish(self, mean: np.ndarray, std: np.ndarray, skipped_image_ids: list[str]) -> None:
        """Trim to the rows written, write the string tables and the normalisation stats, close."""
        self._images.resize(len(self._image_ids), axis=0)
        self._file.create_dataset("checksums", data=np.array(self._checksums, dtype=np.uint32).reshape(-1),
                                  track_times=False)
        for name, strings in (("image_ids", self._image_ids), ("annotations", self._annotations),
                              ("skipped_image_ids", skipped_image_ids)):
            self._file.create_dataset(name, data=np.array(strings, dtype=object).reshape(len(strings)),
                                      dtype=STRING_DTYPE, track_times=False)
        metadata = self._file.create_group("metadata")
        metadata.create_dataset("mean", data=np.asarray(mean, dtype=np.float32), track_times=False)
        metadata.create_dataset("std", data=np.asarray(std, dtype=np.float32), track_times=False)
        self._file.close()


class PackedImageReader:
    """Read access to a packed file, safe across ``fork``: the header is read now, a handle per process on first use."""

    def __init__(self, path: str | os.PathLike):
        self.path = existing_file(path, "packed image file")
        try:
            with h5py.File(self.path, "r") as f:
                self._check_layout(f)
                self.image_size = int(f.attrs["image_size"])
                self.image_width = int(f["images"].shape[2])
                self.resample = str(f.attrs["resample"])
                self.split = str(f.attrs["split"])
                self.image_ids = [str(s) for s in f["image_ids"].asstr()[:]]
                self.skipped_image_ids = [str(s) for s in f["skipped_image_ids"].asstr()[:]]
                self.mean = f["metadata/mean"][:].astype(np.float32)
                self.std = f["metadata/std"][:].astype(np.float32)
                self._checksums = f["checksums"][:].tolist()
        except (OSError, KeyError, UnicodeDecodeError) as e:  # a damaged header, index or string table
            raise ValueError(f"{self.path}: not a readable HDF5 file ({e})") from e
        self._file: h5py.File | None = None
        self._pid: int | None = None

    def _check_layout(self, f: h5py.File) -> None:
        version = f.attrs.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(f"{self.path}: format_version {version}, expected {FORMAT_VERSION}; "
                             "re-run the pack_hdf5 stage")
        for name in ("images", "checksums", "image_ids", "annotations", "skipped_image_ids", "metadata/mean",
                     "metadata/std"):
            if name not in f:
                raise ValueError(f"{self.path}: missing dataset '{name}'")
        images = f["images"]
        size, width = int(f.attrs["image_size"]), images.shape[2] if images.ndim == 4 else -1
        if (images.dtype != np.uint8 or images.shape[1:] != (size, width, 3)
                or images.chunks != (1, size, width, 3) or images.compression is not None):
            raise ValueError(f"{self.path}: 'images' must be uint8 [N, {size}, W, 3] with one "
                             f"uncompressed chunk per image, got {images.dtype} {images.shape} "
                             f"chunks={images.chunks} compression={images.compression}")
        for name in ("image_ids", "checksums"):
            if images.shape[0] != f[name].shape[0]:
                raise ValueError(f"{self.path}: {images.shape[0]} images but {f[name].shape[0]} {name}")

    def __len__(self) -> int:
        return len(self.image_ids)

    @staticmethod
    def image_bytes(path: str | os.PathLike) -> int:
        """Bytes of the images of the packed file at ``path`` (what holding them in RAM takes)."""
        with h5py.File(path, "r") as f:
            return int(f["images"].size) * f["images"].dtype.itemsize

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_file": None, "_pid": None}

    def _images(self) -> h5py.Dataset:
        if self._pid != os.getpid():
            self._file = None  # a handle inherited across fork belongs to the parent: never use it
        if self._file is None:
            self._file = h5py.File(self.path, "r")
            self._pid = os.getpid()
        return self._file["images"]

    def read_into(self, rows: list[int], out: np.ndarray) -> np.ndarray:
        """Copy the images at ``rows`` into ``out`` (C-contiguous uint8 ``[len(rows), S, W, 3]``), each CRC-checked."""
        if not out.flags.c_contiguous or out.dtype != np.uint8:
            raise ValueError("read_into needs a C-contiguous uint8 output array")
        images = self._images()
        flat = out.reshape(len(rows), -1)
        for i, row in enumerate(rows):
            try:
                images.id.read_direct_chunk((row, 0, 0, 0), out=flat[i])
            except (OSError, KeyError, ValueError) as e:  # a damaged chunk index
                raise ValueError(f"{self.path}: image {row} ({self.image_ids[row]}) cannot be read ({e}); "
                                 "the file is damaged: re-run the pack_hdf5 stage") from e
            if zlib.crc32(flat[i]) != self._checksums[row]:
                raise ValueError(f"{self.path}: image {row} ({self.image_ids[row]}) does not match its checksum; "
                                 "the file is damaged: re-run the pack_hdf5 stage")
        return out

    def read_annotations(self) -> list[str]:
        """The label frame JSON of every image, in row order."""
        with h5py.File(self.path, "r") as f:
            return [str(s) for s in f["annotations"].asstr()[:]]

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None
        self._pid = None
