"""The dashcam a rendered frame is seen through: its bonnet, optics and sensor (docs/architecture.md,
generate_scenes). :func:`sample_camera` draws a camera's settings from a generator with the rest of the layout;
:func:`apply_camera` turns a drawn frame into what that camera records. Nothing here moves or hides a labelled
object: the bonnet stays below the nearest object's bottom (render.MIN_Z), so the labels stay exact."""

import io
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

BONNET_MAX = 0.16  # the bonnet (or the dashboard's reflection) covers at most this share of the frame's height


def sample_camera(rng: np.random.Generator, timeofday: str) -> dict:
    """A camera's settings (structured domain randomisation: each drawn independently, the sensor noisier and the
    lamps blooming at night)."""
    night = timeofday == "night"
    bonnet = float(rng.uniform(0.03, BONNET_MAX)) if rng.random() < 0.7 else 0.0
    shade = int(rng.integers(15, 120))
    return {
        "bonnet": bonnet,  # share of the height the ego car's bonnet covers at the centre; 0: none in view
        "bonnet_color": [int(np.clip(shade + rng.integers(-12, 13), 0, 255)) for _ in range(3)],
        "exposure": float(np.exp(rng.normal(0.0, 0.15))),  # gain on every channel
        "white_balance": [float(v) for v in np.exp(rng.normal(0.0, 0.05, 3))],  # gain per channel
        "contrast": float(rng.uniform(0.65, 1.1)),  # a dashcam's tone curve: flatter than a render's
        "saturation": float(rng.uniform(0.55, 1.1)),  # and its colours paler
        "shading": float(rng.uniform(0.0, 0.15)),  # amplitude of a smooth field of light and shadow
        "vignette": float(rng.uniform(0.0, 0.4)),  # darkening at the corners
        "blur": float(rng.uniform(0.0, 1.5)),  # Gaussian blur radius, pixels
        "bloom": float(rng.uniform(0.3, 0.9)) if night else 0.0,  # glare around lamps and lit windows
        "noise": float(rng.uniform(3.0, 9.0) if night else rng.uniform(1.0, 4.0)),  # sensor noise std, levels
        "jpeg": int(rng.integers(30, 91)),  # the camera's own compression, before the dataset's
        "seed": int(rng.integers(2**31)),  # the shading field and the noise
    }


@lru_cache(maxsize=4)
def _radius2(width: int, height: int) -> np.ndarray:
    """float32 ``[H, W, 1]``: squared distance from the centre, 1 at the middle of each edge."""
    y = np.linspace(-1.0, 1.0, height, dtype=np.float32)[:, None, None]
    x = np.linspace(-1.0, 1.0, width, dtype=np.float32)[None, :, None]
    return x * x + y * y


def _draw_bonnet(img: Image.Image, share: float, color: list[int]) -> None:
    """The ego car's bonnet: a wide arc rising ``share`` of the height at the centre, with a faint highlight."""
    w, h = img.size
    top = h * (1.0 - share)
    d = ImageDraw.Draw(img)
    d.ellipse((-0.35 * w, top, 1.35 * w, top + 2 * h * share * 4), fill=tuple(color))
    d.arc((-0.35 * w, top, 1.35 * w, top + 2 * h * share * 4), 240, 300, fill=tuple(min(255, c + 40) for c in color),
          width=2)


def apply_camera(img: Image.Image, camera: dict) -> Image.Image:
    """``img`` as the camera of ``camera`` (:func:`sample_camera`) records it: bonnet, blur, saturation and contrast,
    bloom, exposure and white balance, shading, vignetting, noise, JPEG compression."""
    w, h = img.size
    img = img.copy()
    if camera["bonnet"]:
        _draw_bonnet(img, camera["bonnet"], camera["bonnet_color"])
    if camera["blur"] > 0.2:
        img = img.filter(ImageFilter.GaussianBlur(radius=camera["blur"]))
    pixels = np.asarray(img, dtype=np.float32)  # [H, W, 3]
    luma = pixels.mean(axis=2, keepdims=True)  # [H, W, 1]
    pixels = luma + camera["saturation"] * (pixels - luma)
    pixels = 128.0 + camera["contrast"] * (pixels - 128.0)
    if camera["bloom"]:  # the bright parts, blurred at a quarter of the size (a wide, soft glow) and added
        small = np.asarray(img.reduce(4), dtype=np.float32)
        bright = Image.fromarray(np.clip((small - 170.0) * 3.0, 0, 255).astype(np.uint8))
        glow = bright.filter(ImageFilter.GaussianBlur(radius=2.5)).resize((w, h), Image.BILINEAR)
        pixels += camera["bloom"] * np.asarray(glow, dtype=np.float32)
    rng = np.random.default_rng(camera["seed"])
    field = Image.fromarray(rng.standard_normal((6, 10)).astype(np.float32)).resize((w, h), Image.BICUBIC)
    light = (1.0 + camera["shading"] * np.asarray(field)[..., None]) \
        * (1.0 - 0.5 * camera["vignette"] * _radius2(w, h))  # [H, W, 1]
    pixels *= light
    pixels *= camera["exposure"] * np.asarray(camera["white_balance"], dtype=np.float32)  # [3]
    pixels += camera["noise"] * rng.standard_normal((h, w, 1), dtype=np.float32)
    recorded = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    buffer = io.BytesIO()
    recorded.save(buffer, format="JPEG", quality=camera["jpeg"])
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")
