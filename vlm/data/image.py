"""Decoding an image file as the packed data holds it: what pack_hdf5 stores and what the processor feeds a model."""

import os
from typing import IO

import numpy as np
from PIL import Image

RESAMPLE = {name: Image.Resampling[name.upper()] for name in ("bilinear", "bicubic", "lanczos")}


class CorruptImageError(ValueError):
    """An image file that exists but cannot be decoded; the message names the file."""


# Pixels of the largest image decoded (8K frame: 33 M, BDD100K: 0.9 M); larger ones, or bombs, refused from the header
MAX_IMAGE_PIXELS = 50_000_000


def decode_image(path: str | os.PathLike | IO[bytes], image_size: int, resample: str = "bicubic",
                 image_width: int | None = None, aspect: float | None = None) -> np.ndarray:
    """Any PIL-readable image as RGB uint8 ``[H, W, 3]``, squashed to ``image_width`` x ``image_size`` (None: square),
    first :func:`letterbox`-ed to ``aspect`` if given; EXIF orientation not applied (boxes are in stored pixels)."""
    size = (image_width or image_size, image_size)  # PIL's (width, height)
    try:
        with Image.open(path) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise CorruptImageError(f"{path}: image of {width} x {height} pixels refused: more than "
                                        f"{MAX_IMAGE_PIXELS:,} pixels (a decompression bomb, or not a camera frame)")
            image.draft("RGB", size)  # JPEG only: DCT-domain 1/2, 1/4, 1/8 downscale
            rgb = image.convert("RGB")
        if aspect is not None:
            rgb = letterbox(rgb, aspect)
        if rgb.size != size:
            rgb = rgb.resize(size, RESAMPLE[resample])
        return np.asarray(rgb, dtype=np.uint8)
    except Image.DecompressionBombError as e:  # PIL's own limit, above ours: refused from the header
        raise CorruptImageError(f"{path}: image refused: more than {MAX_IMAGE_PIXELS:,} pixels ({e})") from e
    except CorruptImageError:
        raise
    except (OSError, SyntaxError, ValueError) as e:
        raise CorruptImageError(f"{path}: cannot decode image: {e}") from e


def native_width(frame_size: tuple[float, float], height: int, multiple: int) -> int:
    """``pack.aspect: native``'s width: ``frame_size``'s aspect at ``height``, rounded to a multiple of ``multiple``."""
    frame_width, frame_height = frame_size
    return max(1, round(height * frame_width / frame_height / multiple)) * multiple


def letterbox(image: Image.Image, aspect: float) -> Image.Image:
    """``image`` centred on black bars to the ``aspect`` width / height: nothing cropped, nothing stretched."""
    width, height = image.size
    padded = (max(width, round(height * aspect)), max(height, round(width / aspect)))
    if padded == (width, height):
        return image
    canvas = Image.new(image.mode, padded)
    canvas.paste(image, ((padded[0] - width) // 2, (padded[1] - height) // 2))
    return canvas
