"""The page that `dvc plots show` and `dvc plots diff` write, its Vega, Vega-Lite and vega-embed scripts inlined from
the pinned ``vl-convert-python`` package instead of loaded from a CDN, so that the charts draw offline.

``plots_page.html`` beside this module is DVC's page template (``{plot_divs}``: the charts; ``{refresh_tag}``: the
refresh of a page that DVC rewrites) with the scripts left out; `make setup` writes the full page to
``.dvc/tmp/plots_page.html``, which ``.dvc/config`` names (``plots.html_template``, relative to ``.dvc/``)."""

import argparse
from pathlib import Path

import vl_convert

from vlm.cli import run
from vlm.io import atomic_path

SKELETON = Path(__file__).with_name("plots_page.html")
MARK = "/* VEGA_BUNDLE */"
DVC_PLACEHOLDERS = ("{plot_divs}", "{scripts}", "{refresh_tag}")  # what DVC replaces anywhere in the page


def page() -> str:
    """The template with the scripts in it."""
    bundle = vl_convert.javascript_bundle()  # defines window.vega, window.vegaLite and window.vegaEmbed
    leaks = [p for p in (*DVC_PLACEHOLDERS, "</script") if p in bundle]
    if leaks:
        raise ValueError(f"vl-convert's script bundle holds {', '.join(leaks)}: it cannot be inlined in DVC's page")
    return SKELETON.read_text(encoding="utf-8").replace(MARK, bundle)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", nargs="?", default=".dvc/tmp/plots_page.html")
    args = parser.parse_args(argv)
    with atomic_path(args.out) as tmp:
        tmp.write_text(page(), encoding="utf-8")


if __name__ == "__main__":
    run(main)
