"""Decoding an image file as the packed data holds it: what pack_hdf5 stores and what the processor feeds a model."""

from __future__ import annotations

import os
from typing import IO

import numpy as np
from PIL import Image

RESAMPLE = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


class CorruptImageError(ValueError):
    """An image file that exists but cannot be decoded; the message names the file."""


# The largest image decoded, in pixels (an 8K frame is 33 M, a BDD100K frame 0.9 M): a larger one, or a
# decompression bomb that claims to be larger, is refused from its header before any pixel is decoded.
MAX_IMAGE_PIXELS = 50_000_000


def decode_image(path: str | os.PathLike | IO[bytes], image_size: int, resample: str = "bicubic") -> np.ndarray:
    """Decode any PIL-readable image to RGB uint8 ``[S, S, 3]``, squashed to ``S x S``. EXIF orientation is
    deliberately not applied: label boxes are in stored-pixel coordinates."""
    try:
        with Image.open(path) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise CorruptImageError(f"{path}: image of {width} x {height} pixels refused: more than "
                                        f"{MAX_IMAGE_PIXELS:,} pixels (a decompression bomb, or not a camera frame)")
            image.draft("RGB", (image_size, image_size))  # JPEG only: DCT-domain 1/2, 1/4, 1/8 downscale
            rgb = image.convert("RGB")
        if rgb.size != (image_size, image_size):
            rgb = rgb.resize((image_size, image_size), RESAMPLE[resample])
        return np.asarray(rgb, dtype=np.uint8)
    except Image.DecompressionBombError as e:  # PIL's own limit, above ours: refused from the header
        raise CorruptImageError(f"{path}: image refused: more than {MAX_IMAGE_PIXELS:,} pixels ({e})") from e
    except CorruptImageError:
        raise
    except (OSError, SyntaxError, ValueError) as e:
        raise CorruptImageError(f"{path}: cannot decode image: {e}") from e


