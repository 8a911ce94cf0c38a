"""The visual report (``PREFIX_report.html``) of a real job: the nsfw ResNet-50 calibrated on
natural images. The page is parsed with html.parser: every section present, the per-layer
figures equal to the record file and to the text report, nothing fetched from a URL; the
activation summaries' clipped counts agree with counts made plainly on the data; the page is
rendered by a real headless browser (Debian's chromium) to a PNG whose charts are drawn."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import amct_torch
from amct_torch.calibration.observers import HfmgObserver, IfmrExactObserver, IfmrStreamingObserver
from amct_torch.calibration.summaries import clip_range, summarize
from amct_torch.quality import charts
from amct_torch.quality.evaluate import evaluate, format_stats
from amct_torch.quality.html_report import SECTIONS, page, render
from amct_torch.quality.report import format_table
from amct_torch.record import read_record
from amct_torch.workflow.examples import example_data, example_model
from helpers.html_page import parse


@pytest.fixture(scope="module")
def nsfw_job(tmp_path_factory, nsfw_model, nsfw_images):
    out = tmp_path_factory.mktemp("html") / "nsfw"
    result = amct_torch.quantize(*nsfw_model, nsfw_images, output=str(out), batch_num=2, batch_size=2,
                                 save_type=None, device="cpu", quiet=True)
    with open(result.files["html_report"], encoding="utf-8") as f:
        return result, f.read()


@pytest.mark.slow
def test_nsfw_page_has_every_section_and_the_record_and_text_report_figures(nsfw_job, capsys):
    result, text = nsfw_job
    assert result.files["html_report"].endswith("nsfw_report.html")
    doc = parse(text)
    assert doc.sections == list(SECTIONS)
    record = read_record(result.files["record"])
    assert sorted(doc.layers) == sorted(record)
    # no URL anywhere but in-document references (#id)
    assert doc.urls and all(u.startswith("#") for u in doc.urls), doc.urls
    assert not re.search(r"(src|href)\s*=\s*['\"]?\s*https?:", text)
    # one chart per quantized layer plus the error chart; the page stays well under 2 MB
    assert doc.tags["svg"] == len(record) + 1
    assert len(text.encode()) < 2_000_000
    # the per-layer table: the text report's cosine/SQNR strings, the record's factors
    rows = {r[0]: r for r in doc.rows if len(r) == 8 and r[0] in record}
    assert list(rows) == [s.layer for s in result.report]  # worst first, as the text report
    table = {line.split()[0]: line.split()[2:4] for line in format_table(result.report).splitlines()[1:]}
    for name, rec in record.items():
        row = rows[name]
        assert row[3:5] == table[name]
        assert np.float32(float(row[6])) == np.float32(rec.scale_d)
        assert int(row[7]) == rec.offset_d
    # the summary names the model, the data and the files written
    kv = {r[0]: r[1] for r in doc.rows if len(r) == 2}
    assert kv["model"] == nsfw_job[0].graph.model_file
    assert kv["record"] == result.files["record"] and kv["html_report"] == result.files["html_report"]
    assert "calibrating" in kv
    # Jupyter shows the same report inline
    assert parse(result._repr_html_()).sections == list(SECTIONS)


@pytest.mark.slow
def test_nsfw_page_renders_in_a_headless_browser(nsfw_job, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs Debian's chromium package (apt-get install -y chromium) for the rendering check")
    from matplotlib.image import imread
    result, text = nsfw_job
    # the first layer's section opened, the summary closed: both chart kinds in the window
    opened = text.replace('data-section="summary" open', 'data-section="summary"')
    opened = opened.replace('data-section="layers"', 'data-section="layers" open')
    opened = opened.replace('<details class="layer"', '<details open class="layer"', 1)
    html_file = tmp_path / "page.html"
    html_file.write_text(opened, encoding="utf-8")
    png = tmp_path / "shot.png"
    if os.environ.get("AMCT_REPORT_SHOT"):  # to look at it: a folder to copy the page and shot into
        png = Path(os.environ["AMCT_REPORT_SHOT"]) / "nsfw_report.png"
        shutil.copyfile(result.files["html_report"], png.with_suffix(".html"))
    headless = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run(headless + [f"--screenshot={png}", "--window-size=1100,2600", html_file.as_uri()],
                   capture_output=True, timeout=120, check=True)
    img = imread(str(png))[..., :3]
    assert img.shape[0] >= 2000

    def pixels(rgb: str) -> int:
        want = np.array([int(rgb[i:i + 2], 16) / 255 for i in (1, 3, 5)])
        return int((np.abs(img - want).max(axis=2) < 0.04).sum())
    # the charts' blue (bars, histogram, weights) and orange (clip lines, ±127·scale_w) are drawn
    assert pixels(charts.OK_COLOR) > 20000
    assert pixels(charts.CLIP_COLOR) > 150
    # the inline script: a click on the SQNR column sorts ascending, the box filters by name
    probe = """<script>var r=document.querySelector('.amct-report');
r.querySelectorAll('table.sortable th')[4].click();
var first=r.querySelector('table.layers tbody tr').cells[0].textContent;
var q=r.querySelector('input.search');q.value='stage0';q.oninput();
var shown=Array.from(r.querySelectorAll('details.layer')).filter(function(d){return d.style.display!=='none';});
document.body.setAttribute('data-probe',first+'|'+shown.length);</script></body>"""
    html_file.write_text(text.replace("</body>", probe), encoding="utf-8")
    dom = subprocess.run(headless + ["--dump-dom", html_file.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    lowest = min(result.report, key=lambda s: s.sqnr_db).layer
    stage0 = sum(1 for s in result.report if "stage0" in s.layer)
    assert f'data-probe="{lowest}|{stage0}"' in dom


def test_report_is_written_by_the_job_and_not_without_report(tmp_path):
    proto, weights = example_model()
    x, _ = example_data("calib")
    on = amct_torch.quantize(proto, weights, x[:40], output=str(tmp_path / "a" / "m"), batch_num=2,
                             save_type="Fakequant", quiet=True, device="cpu")
    assert os.path.isfile(on.files["html_report"])
    # evaluate's result: Jupyter shows its rows as the CLI's table has them
    ev = evaluate(on.files["fake_quant_model"], on.files["fake_quant_weights"], x[:16], reference=(proto, weights))
    cli_rows = {line.split()[0]: line.split() for line in format_stats(ev).splitlines()[1:]}
    html_rows = [r for r in parse(ev._repr_html_()).rows if r[0] in cli_rows]
    assert len(html_rows) == len(ev) >= 1
    for r in html_rows:
        assert r[2:5] == cli_rows[r[0]][-3:]
    off = amct_torch.quantize(proto, weights, x[:40], output=str(tmp_path / "b" / "m"), batch_num=2,
                              save_type=None, quiet=True, report=False, device="cpu")
    assert "html_report" not in off.files
    assert sorted(os.listdir(tmp_path / "b")) == ["m_quant_config.json", "m_record.txt"]
    assert off.report_page is None
    assert "no report" in off._repr_html_()
    # the accuracy hook: figures given, a table with them and the drop (float minus int8)
    doc = parse(on.report_html(accuracy=[("top-1 %", 97.25, 96.5)]))
    assert ["metric", "float", "int8", "drop (int8)"] in doc.rows
    assert ["top-1 %", "97.25", "96.5", "+0.75"] in doc.rows


def test_page_without_matplotlib_says_how_to_get_the_charts(tmp_path, monkeypatch):
    proto, weights = example_model()
    x, _ = example_data("calib")
    res = amct_torch.quantize(proto, weights, x[:40], output=str(tmp_path / "m"), batch_num=2,
                              save_type=None, quiet=True, device="cpu")
    monkeypatch.setattr(charts, "rc_context", None)
    res.report_page.charts = {}
    text = page(render(res.report_page))
    doc = parse(text)
    assert doc.sections == list(SECTIONS) and "svg" not in doc.tags
    assert "pip install matplotlib" in text


def _plain_clipped(x: np.ndarray, scale: float, offset: int) -> tuple[int, int]:
    """Values whose code ``round(x/scale) + offset`` falls outside [-128, 127], counted directly."""
    q = np.round(x.astype(np.float64) / scale) + offset
    return int((q < -128).sum()), int((q > 127).sum())


@pytest.mark.parametrize("kind", ["streaming", "exact", "hfmg"])
def test_summary_counts_clipped_values_as_the_grid_does(kind, device):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(20000), rng.standard_normal(50) * 8]).astype(np.float32)
    obs = {"streaming": IfmrStreamingObserver, "exact": IfmrExactObserver,
           "hfmg": lambda n: HfmgObserver(n, num_of_bins=4096)}[kind]("conv")
    for part in np.array_split(x, 3):
        obs.update(torch.from_numpy(part).to(device))
    scale, offset = obs.compute()
    s = summarize(obs, scale, offset)
    assert s.count == x.size and sum(s.counts) == x.size
    assert s.lo == pytest.approx(float(x.min()), rel=1e-6) and s.hi == pytest.approx(float(x.max()), rel=1e-6)
    assert s.clip == clip_range(scale, offset) == ((-128 - offset) * scale, (127 - offset) * scale)
    low, high = _plain_clipped(x, scale, offset)
    assert low + high > 0
    if kind == "hfmg":  # from 4096 bins: within a bin's worth of values of the edge
        assert abs(s.clipped_low - low) + abs(s.clipped_high - high) <= 0.002 * x.size
    else:  # exact values kept (every value, or the top/bottom 1024)
        assert (s.clipped_low, s.clipped_high) == (low, high)


@pytest.mark.slow
def test_improvements_section_shows_each_stage_as_the_pipeline_reports_it(tmp_path):
    from amct_torch.improve.pipeline import summary_line
    proto, weights = example_model()
    x, _ = example_data("calib")
    res = amct_torch.quantize(proto, weights, x, output=str(tmp_path / "m"), batch_num=2, save_type=None,
                              quiet=True, device="cpu", improve="bias_correction")
    imp = res.improvement
    doc = parse(res._repr_html_())
    stages = {r[0]: r for r in doc.rows if len(r) == 6 and r[0] in {s["name"] for s in imp["stages"]}}
    assert len(stages) == len(imp["stages"]) >= 1
    for st in imp["stages"]:
        row = stages[st["name"]]
        assert float(row[1]) == pytest.approx(st["worst_output_sqnr_db"], abs=0.005)
        assert float(row[2]) == pytest.approx(st["gain_db"], abs=0.005)
        assert row[4] == ("kept" if st["name"] == imp["kept"] else "passed" if st["passed"] else "rejected")
    assert summary_line(imp) in res.report_html().replace("&#x27;", "'").replace("&quot;", '"')


def test_large_models_chart_the_worst_layers_and_list_every_one(monkeypatch):
    """Over ``MAX_LAYER_CHARTS`` entries only the worst get a chart; every layer keeps its table
    row and section, so a detector's page stays light and complete."""
    from amct_torch.calibration.summaries import ActivationSummary
    from amct_torch.quality import html_report
    from amct_torch.quality.report import LayerStat
    from amct_torch.record import LayerRecord

    monkeypatch.setattr(html_report, "MAX_LAYER_CHARTS", 4)
    names = [f"conv{i}" for i in range(10)]
    stats = sorted((LayerStat(n, "Convolution", 1.0 - 0.001 * (i % 7), 30.0 - i, 100) for i, n in enumerate(names)),
                   key=lambda s: s.cosine)
    records = {n: LayerRecord(scale_d=0.01, offset_d=-128, scale_w=[0.02, 0.03]) for n in names}
    summ = ActivationSummary("ifmr", 100, 0.0, 2.0, [0.0, 1.0, 2.0], [90, 10], 0.01, -128, 0, 3)
    inp = html_report.ReportInputs(model_file="m.prototxt", stats=stats, records=records,
                                   summaries={n: summ for n in names},
                                   weights={n: html_report.WeightRange([-1.0, -2.0], [1.0, 2.0], [2.5, 3.8]) for n in names},
                                   floats=[("fc", "InnerProduct", "skipped (quant_enable false)")])
    doc = parse(render(inp))
    assert doc.tags["svg"] == 4 + 1  # the 4 worst layers and the error chart
    assert set(inp.charts) - {"errors"} == {s.layer for s in stats[:4]}
    assert doc.layers == [s.layer for s in stats]  # every layer's section, worst first
    table = [r for r in doc.rows if len(r) == 8 and r[0] != "layer"]
    assert [r[0] for r in table] == [s.layer for s in stats] + ["fc"]
    assert table[-1][2].startswith("float: skipped")
    assert table[0][5] == "3"  # clipped % of 3 values in 100
    assert "Charts of the 4 worst layers" in render(inp)
