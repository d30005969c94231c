"""``--format html`` of ``report`` and ``recommend`` on a user's terminal: without matplotlib (the ``report``
extra) one line naming the install command and exit 2, before any query; with it, none of matplotlib's
"Glyph ... missing" warnings for names its font lacks (the SVG keeps text as text, the browser draws it)."""

from __future__ import annotations

import sys
import warnings

import pytest
from test_recommend import WEEK, Prices, WorkloadKey, result, stats
from test_report import POD_DAY, FakePrometheus, day_report, serve

from gpuagent.cli import main
from gpuagent.recommend.formats import renderer as recommend_renderer
from gpuagent.recommend.model import Options, Row
from gpuagent.recommend.rules import recommend
from gpuagent.recommend.savings import savings
from gpuagent.report.formats import renderer as report_renderer

INSTALL = "pip install 'gpuagent[report]'"
ODD_NAMES = ("训练", "模型-0 🚀")


def without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if matplotlib were not installed: every matplotlib module, and our pages that imported it, gone."""
    for name in list(sys.modules):
        if name.partition(".")[0] == "matplotlib":
            monkeypatch.setitem(sys.modules, name, None)
        elif name.endswith(("formats.html_page", "formats.plots", "formats.svgplot")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.mark.parametrize("command", ["report", "recommend"])
def test_html_without_matplotlib_is_one_line_naming_the_install_and_exit_2(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    without_matplotlib(monkeypatch)
    # port 9 (discard) is never asked: the missing extra is known before any query
    code = main([command, "--prometheus", "http://127.0.0.1:9", "--since", "1d", "--format", "html"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(f"gpuagent {command}: --format html draws its plots with matplotlib, which is not "
                          "installed") and INSTALL in err
    assert err.count("\n") == 1, err


def test_report_html_of_names_the_font_lacks_warns_nothing() -> None:
    odd = FakePrometheus()
    odd.pods = {(*ODD_NAMES, "GPU-aaaa"): POD_DAY[("training", "llama-ft-0", "GPU-aaaa")]}
    with serve(odd) as fake, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        page = report_renderer("html")(day_report(fake))
    assert [str(w.message) for w in caught] == []
    assert f">{ODD_NAMES[0]}<" in page  # drawn by the browser, as text


def test_recommend_html_of_names_the_font_lacks_warns_nothing() -> None:
    odd = stats(WorkloadKey(ODD_NAMES[0], "Deployment", ODD_NAMES[1]))
    rec = recommend(odd, Options())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        page = recommend_renderer("html")(result([Row(odd, rec, savings(odd, rec, WEEK, Prices()))]))
    assert [str(w.message) for w in caught] == []
    assert ODD_NAMES[1] in page
