"""Pictures a person would rather look at than read: contact sheets of scenes with their questions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from vlm.io import atomic_path


def contact_sheet(tiles: list[tuple[Image.Image, list[tuple[str, tuple[int, int, int]]]]], columns: int = 4,
                  tile_width: int = 400, font_size: int = 13, max_lines: int = 4) -> Image.Image:
    """A grid of images, each with coloured caption lines underneath.

    ``tiles`` holds ``(image, [(text, rgb), ...])``; images are resized to ``tile_width`` keeping
    their aspect ratio; captions are clipped to ``max_lines`` lines that fit the tile width.
    """
    font = ImageFont.load_default(size=font_size)
    line_h = font_size + 4
    first = tiles[0][0]
    tile_h = round(tile_width * first.height / first.width)
    cell_h = tile_h + 6 + max_lines * line_h
    rows = (len(tiles) + columns - 1) // columns
    size = (columns * tile_width + (columns + 1) * 4, rows * cell_h + (rows + 1) * 4)
    sheet = Image.new("RGB", size, (250, 250, 250))
    draw = ImageDraw.Draw(sheet)
    for k, (image, lines) in enumerate(tiles):
        x = 4 + (k % columns) * (tile_width + 4)
        y = 4 + (k // columns) * (cell_h + 4)
        sheet.paste(image.convert("RGB").resize((tile_width, tile_h), Image.BILINEAR), (x, y))
        for j, (text, color) in enumerate(lines[:max_lines]):
            while text and draw.textlength(text, font=font) > tile_width - 4:
                text = text[:-2] + "…"
            draw.text((x + 2, y + tile_h + 3 + j * line_h), text, fill=color, font=font)
    return sheet


def save_figure(fig: Any, path: Path) -> None:
    """Write a matplotlib figure as PNG atomically and close it."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def save_image(image: Image.Image, path: Path) -> None:
    with atomic_path(path) as tmp:
        image.save(tmp, format="PNG", optimize=True)
