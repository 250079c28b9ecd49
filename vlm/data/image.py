"""Decoding an image file as the packed data holds it: what pack_hdf5 stores and what the processor feeds a model."""

import os
from typing import IO

import numpy as np
from PIL import ExifTags, Image, ImageOps

RESAMPLE = {name: Image.Resampling[name.upper()] for name in ("bilinear", "bicubic", "lanczos")}


class CorruptImageError(ValueError):
    """An image file that exists but cannot be decoded; the message names the file."""


# Pixels of the largest image decoded (8K frame: 33 M, BDD100K: 0.9 M); larger ones, or bombs, refused from the header
MAX_IMAGE_PIXELS = 50_000_000


def decode_image(path: str | os.PathLike | IO[bytes], image_size: int, resample: str = "bicubic",
                 image_width: int | None = None, aspect: float | None = None, upright: bool = False) -> np.ndarray:
    """Any PIL-readable image as RGB uint8 ``[H, W, 3]``, squashed to ``image_width`` x ``image_size`` (None: square),
    first :func:`letterbox`-ed to ``aspect`` if given. ``upright``: turned as its EXIF orientation says, as a viewer
    shows a photo (the pack stage keeps the stored pixels, in which the boxes are)."""
    size = (image_width or image_size, image_size)  # PIL's (width, height)
    try:
        with Image.open(path) as image:
            turned = upright and image.getexif().get(ExifTags.Base.Orientation, 1) in (5, 6, 7, 8)  # by 90 degrees
            image.draft("RGB", size[::-1] if turned else size)  # JPEG only: DCT-domain 1/2, 1/4, 1/8 downscale
            width, height = image.size  # the pixels to decode: a JPEG's at its draft scale
            if width * height > MAX_IMAGE_PIXELS:
                raise CorruptImageError(f"{path}: image of {width} x {height} pixels refused: more than "
                                        f"{MAX_IMAGE_PIXELS:,} pixels (a decompression bomb, or not a camera frame)")
            rgb = to_rgb(ImageOps.exif_transpose(image) if upright else image, path)
        if aspect is not None:
            rgb = letterbox(rgb, aspect, size, resample)
        if rgb.size != size:
            rgb = rgb.resize(size, RESAMPLE[resample])
        return np.asarray(rgb, dtype=np.uint8)
    except Image.DecompressionBombError as e:  # PIL's own limit, above ours: refused from the header
        raise CorruptImageError(f"{path}: image refused: more than {MAX_IMAGE_PIXELS:,} pixels ({e})") from e
    except CorruptImageError:
        raise
    except (OSError, SyntaxError, ValueError) as e:
        raise CorruptImageError(f"{path}: cannot decode image: {e}") from e


def to_rgb(image: Image.Image, path: str | os.PathLike | IO[bytes]) -> Image.Image:
    """``image`` as 8-bit RGB: 16-bit greys keep their top 8 bits (PIL's ``convert`` would clip them at 255, a white
    frame); 32-bit integer or float pixels, whose range no header states, are refused."""
    if image.mode.startswith("I;16"):
        image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8))  # mode L
    elif image.mode in ("I", "F"):
        kind = "integer" if image.mode == "I" else "floating-point"
        raise CorruptImageError(f"{path}: 32-bit {kind} pixels (PIL mode {image.mode}), whose range the file does not "
                                f"state: save it as an 8- or 16-bit image")
    return image.convert("RGB")


def native_width(frame_size: tuple[float, float], height: int, multiple: int) -> int:
    """``pack.aspect: native``'s width: ``frame_size``'s aspect at ``height``, rounded to a multiple of ``multiple``."""
    frame_width, frame_height = frame_size
    return max(1, round(height * frame_width / frame_height / multiple)) * multiple


def letterbox(image: Image.Image, aspect: float, size: tuple[int, int] | None = None,
              resample: str = "bicubic") -> Image.Image:
    """``image`` centred on black bars to the ``aspect`` width / height: nothing cropped, nothing stretched. With
    ``size`` (width, height) the padded frame is that size: the image is resized into it first, so a large photo is
    never padded at full size. An image already of ``aspect`` is returned as it is."""
    width, height = image.size
    padded = (max(width, round(height * aspect)), max(height, round(width / aspect)))
    if padded == (width, height):
        return image
    size = size or padded
    inner = (max(1, round(width * size[0] / padded[0])), max(1, round(height * size[1] / padded[1])))
    canvas = Image.new(image.mode, size)
    canvas.paste(image if inner == image.size else image.resize(inner, RESAMPLE[resample]),
                 ((size[0] - inner[0]) // 2, (size[1] - inner[1]) // 2))
    return canvas
