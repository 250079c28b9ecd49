"""Every picture the project draws (the measuring code hands it the numbers): matplotlib figures, drawn without
pyplot and loaded by the first figure (a stage drawing only PIL contact sheets never loads it), and contact sheets."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vlm.commands.types import QUESTION_TYPES
from vlm.io import atomic_path

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

Line = tuple[str, tuple[int, int, int]]  # a caption line of a tile: (text, rgb)

MODEL_COLORS = {"vlm": "#2b6cb0", "blind": "#a0aec0", "most_common": "#dd6b20"}
MODEL_NAMES = {"vlm": "VLM", "blind": "blind (text only)", "most_common": "each type's most common answer"}
RATES = ("accuracy_original", "accuracy_edited", "consistency", "changed_when_it_must", "stayed_when_it_must")
TEXT, GREY, GREEN, RED = (20, 20, 20), (90, 90, 90), (20, 120, 40), (190, 30, 30)


def _figure(**kwargs) -> Figure:
    """A new matplotlib figure (``Figure`` keyword arguments: figsize, ...)."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def save_figure(fig: Figure, path: Path, dpi: int = 110) -> None:
    """Write a matplotlib figure as PNG atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)


def save_image(image: Image.Image, path: Path) -> None:
    with atomic_path(path) as tmp:
        image.save(tmp, format="PNG", optimize=True)


def contact_sheet(tiles: list[tuple[Image.Image, list[Line]]], columns: int = 4, tile_width: int = 400,
                  font_size: int = 13, max_lines: int = 4) -> Image.Image:
    """A grid of ``tiles`` ``(image, [(text, rgb), ...])``, images at ``tile_width``, clipped captions underneath."""
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


def load_original(path: Path, width: int = 640) -> Image.Image:
    """An image file as RGB, JPEG-decoded at a reduced size (PIL's draft: 1/2, 1/4 or 1/8 while both sides stay at
    least ``width``, so a 1280 x 720 frame whole)."""
    with Image.open(path) as image:
        image.draft("RGB", (width, width))
        return image.convert("RGB")


def commands_sheet(images: list[tuple[Path, list[dict]]], per_image: int = 4) -> Image.Image:
    """One tile per ``(image file, its question records)``, with up to ``per_image`` Q/A lines."""
    tiles = []
    for path, records in images:
        questions = sorted(records, key=lambda r: r["command_type"])[:per_image]
        with Image.open(path) as image:
            image.draft("RGB", (image.width // 4, image.height // 4))
            lines = [(f"{r['command']} {r['answer'].upper()}", QUESTION_TYPES[r["command_type"]].color)
                     for r in questions]
            tiles.append((image.convert("RGB"), lines))
    return contact_sheet(tiles, columns=4, max_lines=per_image)


def _prediction(row: Any, color: tuple[int, int, int]) -> Line:
    """The caption line of a prediction table row: its answer, the prediction and its probability."""
    return f"answer {row['answer']}, predicted {row['prediction']} ({row['probability']:.0%})", color


def attention_sheet(rows: pd.DataFrame, image_paths: dict[str, Path], heat: np.ndarray | None) -> Image.Image:
    """Each row's image under its ``heat`` ``[B, Gh, Gw]`` map (None: none), with the question and the prediction."""
    from matplotlib import colormaps

    tiles = []
    for k, (_, row) in enumerate(rows.iterrows()):
        image = load_original(image_paths[row["image_id"]])
        if heat is not None:
            scaled = (heat[k] - heat[k].min()) / max(float(heat[k].max() - heat[k].min()), 1e-12)  # [Gh, Gw] in 0..1
            overlay = Image.fromarray((colormaps["inferno"](scaled)[..., :3] * 255).astype(np.uint8))
            image = Image.blend(image, overlay.resize(image.size, Image.BICUBIC), 0.45)
        ok = row["prediction"] == row["answer"]
        tiles.append((image, [(row["command"], TEXT), _prediction(row, GREEN if ok else RED)]))
    return contact_sheet(tiles, columns=4, max_lines=2)


def failure_sheet(failures: pd.DataFrame, image_paths: dict[str, Path]) -> Image.Image:
    """Wrong predictions: each question's image with the question, the prediction and the conditions."""
    tiles = [(load_original(image_paths[row["image_id"]]),
              [(row["command"], TEXT), _prediction(row, RED),
               (f"{row['command_type']}; {row['timeofday']}, {row['weather']}", GREY)])
             for _, row in failures.iterrows()]
    return contact_sheet(tiles, columns=4, max_lines=3)


def counterfactual_sheet(shown: list[tuple[Any, Any]]) -> Image.Image:
    """Original and edit side by side where the answer had to change and did not; ``shown``: (Pair, table row)."""
    tiles = []
    for pair, row in shown:
        tiles.append((pair.original.image, [(row.command, TEXT),
                                            (f"original: {row.answer_before}, model {row.predicted_before}", GREY)]))
        tiles.append((pair.edited_image, [(pair.description, TEXT),
                                          (f"edited: {row.answer_after}, model {row.predicted_after}", RED)]))
    return contact_sheet(tiles, columns=4, max_lines=2)


def summary_figure(metrics: dict) -> Figure:
    """Per-type accuracy bars (VLM vs blind) and the VLM's yes/no/maybe confusion matrix."""
    types = [t for t in QUESTION_TYPES if t in metrics["vlm"]["per_type"]]
    fig = _figure(figsize=(12, 4.2))
    bars, conf = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
    x = np.arange(len(types))
    for offset, model in ((-0.2, "vlm"), (0.2, "blind")):
        values = [metrics[model]["per_type"].get(t, 0.0) for t in types]
        bars.bar(x + offset, values, width=0.4, color=MODEL_COLORS[model],
                 label=f"{MODEL_NAMES[model]}: {metrics[model]['accuracy']:.1%} overall")
        for xi, v in zip(x + offset, values):
            bars.text(xi, v + 0.01, f"{v:.0%}", ha="center", fontsize=8)
    bars.set_xticks(x, [t.replace("_", " ") for t in types])
    bars.set(ylim=(0, 1.22), yticks=np.linspace(0, 1, 6), ylabel=f"accuracy on {metrics['split']}",
             title="Accuracy per command type")
    bars.legend(loc="upper center", ncol=2, fontsize=8)
    confusion = metrics["vlm"]["confusion_yes_no_maybe"]
    matrix = np.array(confusion["matrix"])  # [actual, predicted]
    conf.imshow(matrix, cmap="Blues")
    for (i, j), v in np.ndenumerate(matrix):
        conf.text(j, i, str(v), ha="center", va="center", color="white" if v > matrix.max() / 2 else "black")
    conf.set_xticks(range(len(confusion["predicted"])), confusion["predicted"])
    conf.set_yticks(range(len(confusion["actual"])), confusion["actual"])
    conf.set(xlabel="predicted", ylabel="actual", title="VLM on yes/no/maybe questions")
    fig.tight_layout()
    return fig


def slices_figure(slices: dict[str, dict], counts: dict[str, dict]) -> Figure:
    """Accuracy per condition, VLM and blind side by side, a panel per dimension of ``counts`` (questions bracketed)."""
    dimensions = list(counts)
    columns = 4
    rows = -(-len(dimensions) // columns)
    fig = _figure(figsize=(4.2 * columns, 3.0 * rows))
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax, dimension in zip(axes.flat, dimensions):
        values = list(counts[dimension])
        y = np.arange(len(values))
        for offset, model in ((-0.2, "vlm"), (0.2, "blind")):
            ax.barh(y + offset, [slices[model][dimension][v] for v in values], height=0.4, color=MODEL_COLORS[model],
                    label="VLM" if model == "vlm" else "blind")
        ax.set_yticks(y, [f"{v} ({counts[dimension][v]})" for v in values], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_title(dimension.replace("_", " "), fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
    for ax in list(axes.flat)[len(dimensions):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Accuracy per condition (questions in brackets)")
    fig.tight_layout()
    return fig


def reliability_figure(metrics: dict, bins: int) -> Figure:
    """Reliability diagram: accuracy against the mean probability of the answer given, in ``bins`` equal bins."""
    fig = _figure(figsize=(10, 4.2))
    for ax, model in zip(fig.subplots(1, 2), ("vlm", "blind")):
        rows = metrics[model]["reliability"]
        ax.bar([r["low"] for r in rows], [r["accuracy"] for r in rows], width=1 / bins, align="edge",
               color=MODEL_COLORS[model], edgecolor="white", label="accuracy in the bin")
        ax.plot([r["confidence"] for r in rows], [r["accuracy"] for r in rows], "o", color="black", markersize=3)
        ax.plot([0, 1], [0, 1], "--", color="grey", label="calibrated")
        for r in rows:
            ax.text(r["low"] + 0.5 / bins, 0.02, str(r["questions"]), ha="center", fontsize=7, rotation=90,
                    color="white")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="probability of the answer given", ylabel="accuracy",
               title=f"{MODEL_NAMES[model]}: ECE {metrics[model]['ece']:.3f}")
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def real_figure(summary: dict, frames: int, bins: int) -> Figure:
    """Real frames: accuracy per command type of the VLM, the blind baseline and each type's most common answer, and
    the VLM's reliability diagram."""
    types = [t for t in QUESTION_TYPES if t in summary["vlm"]["per_type"]]
    fig = _figure(figsize=(13, 4.2))
    bars, reliability = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
    x = np.arange(len(types))
    for k, model in enumerate(MODEL_COLORS):
        values = [summary[model]["per_type"][t] for t in types]
        bars.bar(x + (k - 1) * 0.27, values, width=0.27, color=MODEL_COLORS[model],
                 label=f"{MODEL_NAMES[model]}: {summary[model]['accuracy']:.1%} overall")
        for xi, v in zip(x + (k - 1) * 0.27, values):
            bars.text(xi, v + 0.01, f"{v:.0%}", ha="center", fontsize=7)
    bars.set_xticks(x, [t.replace("_", " ") for t in types])
    bars.set(ylim=(0, 1.25), yticks=np.linspace(0, 1, 6), ylabel="accuracy",
             title=f"Real frames, zero-shot ({frames} frames)")
    bars.legend(loc="upper center", ncol=3, fontsize=7)
    rows = summary["vlm"]["reliability"]
    reliability.bar([r["low"] for r in rows], [r["accuracy"] for r in rows], width=1 / bins, align="edge",
                    color=MODEL_COLORS["vlm"], edgecolor="white")
    reliability.plot([0, 1], [0, 1], "--", color="grey")
    reliability.set(xlim=(0, 1), ylim=(0, 1), xlabel="probability of the answer given", ylabel="accuracy",
                    title=f"VLM on real frames: ECE {summary['vlm']['ece']:.3f}")
    fig.tight_layout()
    return fig


def counterfactuals_figure(summary: dict[str, dict]) -> Figure:
    """Per edit: accuracy on the originals and the edits, consistency, changed / stayed when it had to."""
    edits = list(summary)
    fig = _figure(figsize=(12, 4.5))
    ax = fig.subplots()
    width = 0.8 / len(RATES)
    x = np.arange(len(edits))
    for k, rate in enumerate(RATES):
        values = [summary[e][rate] if summary[e][rate] is not None else np.nan for e in edits]
        ax.bar(x + (k - (len(RATES) - 1) / 2) * width, values, width=width, label=rate.replace("_", " "))
    ax.set_xticks(x, [f"{e.replace('_', ' ')}\n({summary[e]['pairs']} pairs)" for e in edits], fontsize=8)
    ax.set(ylim=(0, 1.15), ylabel="fraction of questions",
           title="Counterfactual edits: does the answer change exactly where the rules say it must?")
    ax.legend(ncol=len(RATES), fontsize=8, loc="upper center")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def note_figure(text: str) -> Figure:
    """A line of text where a figure would be (nothing to draw)."""
    fig = _figure(figsize=(6, 1.2))
    fig.text(0.5, 0.5, text, ha="center", va="center")
    return fig


def dataloader_figure(metrics: dict[str, Any]) -> Figure:
    """Grouped bars of samples/s per (workers, batch size), one panel per image size, log scale."""
    sizes = list(metrics["samples_per_s"])
    fig = _figure(figsize=(6 * len(sizes), 4))
    axes = fig.subplots(1, len(sizes), squeeze=False, sharey=True)
    for ax, size in zip(axes[0], sizes):
        tables = metrics["samples_per_s"][size]
        keys = list(tables["naive"])
        x = np.arange(len(keys))
        width = 0.8 / len(tables)
        for i, (name, table) in enumerate(tables.items()):
            ax.bar(x + (i - (len(tables) - 1) / 2) * width, [table[k] for k in keys], width, label=name)
        ax.set_xticks(x, [k.replace("workers", "w").replace("_batch", "\nb") for k in keys])
        ax.set(yscale="log", title=f"{size}: ours {metrics['speedup'][size]}x naive (best of each)")
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("samples/s")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncols=len(labels))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig
