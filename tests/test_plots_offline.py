"""`dvc plots show` draws every chart offline. Its page template (.dvc/config's plots.html_template, written by `make
setup` from vlm/plots_page.html) carries Vega, Vega-Lite and vega-embed from the pinned vl-convert-python package; DVC's
default page loads them from a CDN and draws nothing without a network. Checked in headless Chromium (Debian's
package, which `make test` installs where it can) with every request off the machine refused."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dvc_render.base import Renderer

from vlm import plots_page

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
COPIED = ("dvc.yaml", "params.yaml", "dvclive", "metrics", ".dvc/plots", ".dvc/config")


def test_every_plot_id_is_a_valid_html_id():
    """DVC turns a plot's title into the id that `vegaEmbed('#<id>')` looks up, keeping quotes: an apostrophe in a
    title is a JavaScript syntax error on the page, and that chart stays blank."""
    plots = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    titles = [p if isinstance(p, str) else next(iter(p)) for p in plots]
    for title in titles:
        assert re.fullmatch(r"[A-Za-z][\w-]*", Renderer.remove_special_chars(title)), title


def test_the_page_inlines_the_scripts_and_keeps_dvcs_placeholders():
    page = plots_page.page()
    assert "{plot_divs}" in page and "{scripts}" not in page and "<script src" not in page
    assert "window.vegaEmbed=" in page and "window.vegaLite=" in page


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH (Debian: apt-get install chromium; make test "
                                             "installs it where it may)")
def test_dvc_plots_show_draws_every_chart_with_the_network_off(tmp_path):
    repo = tmp_path / "repo"
    for name in COPIED:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, repo / name)
    plots_page.main([str(repo / ".dvc" / "tmp" / "plots_page.html")])  # as `make setup` does
    with open(repo / ".dvc" / "config", "a", encoding="utf-8") as f:
        f.write("[core]\n    no_scm = true\n")  # the committed files without git's history
    dvc = Path(sys.executable).with_name("dvc")
    subprocess.run([str(dvc), "plots", "show", "-o", str(tmp_path / "out")], cwd=repo, check=True, capture_output=True)
    html = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    charts = re.findall(r"vegaEmbed\('#([^']*)'", html)
    assert len(charts) >= 8 and "cdn" not in html
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9",
                          "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=20000", "--dump-dom",
                          (tmp_path / "out" / "index.html").as_uri()],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    for chart in charts:  # each chart's div holds the SVG vega-embed drew, with its axes
        div = dom.split(f'id="{chart}"', 1)[1].split('<div id="', 1)[0]
        assert 'role="graphics-document"' in div and "X-axis titled" in div, chart
