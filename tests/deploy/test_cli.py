"""The `nestflex` CLI (python -m nestflex.deploy) on a tiny bundle, in subprocesses."""

import json
import subprocess
import sys

import pytest

import nestflex.deploy as nd
from nestflex.deploy import cli
from tests.export.bundles import write_bundle, write_flex_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    info, _, _ = write_bundle(tmp_path_factory.mktemp("cli"), onnx=False)
    return info["bundle"]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "nestflex.deploy", *args], capture_output=True, text=True)


def test_inspect_prints_levels_exits_splits_and_sizes(bundle):
    out = _run("inspect", bundle)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "levels (3, nested=True)" in text and "exits (3, progressive, backbone shared, confidence max_prob" in text
    assert "split points (" in text and "features.relu1" in text and "weights.safetensors" in text
    m = json.loads(open(f"{bundle}/manifest.json").read())
    assert f"{m['levels'][-1]['macs']:,}" in text
    as_json = json.loads(_run("inspect", bundle, "--json").stdout)
    assert as_json == m


def test_bench_reports_median_latency_per_level_and_exit(bundle, tmp_path):
    out = _run("bench", bundle, "--repeats", "2", "--json", str(tmp_path / "bench.json"))
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "bench.json").read_text())
    assert [r["level"] for r in result["levels"]] == [0, 1, 2] and all(r["latency_ms"] > 0 for r in result["levels"])
    assert [e["exit"] for e in result["exits"]] == [0, 1, 2] and len(result["switches"]) == 6
    assert "latency ms" in out.stdout and "0 -> 1" in out.stdout


def test_errors_are_one_line_and_exit_2(tmp_path):
    out = _run("inspect", str(tmp_path / "none.nfx"))
    assert out.returncode == 2 and out.stderr.startswith("error: bundle ") and "does not exist" in out.stderr
    out = _run("bench", str(tmp_path), "--repeats", "0")
    assert out.returncode == 2 and "--repeats and --batch-size must be >= 1, got 0 and 1" in out.stderr


def test_simulate_forwards_its_argv(monkeypatch, capsys):
    seen = []
    fake = type(sys)("nestflex.deploy.simulation")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "nestflex.deploy.simulation", fake)
    assert cli.main(["simulate", "--bundle", "x.nfx", "--help-me"]) == 0
    assert seen == [["--bundle", "x.nfx", "--help-me"]]


def test_simulate_without_the_module_says_so(monkeypatch, capsys):
    import importlib

    real = importlib.import_module

    def missing(name, *a, **k):
        if name == "nestflex.deploy.simulation":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *a, **k)

    monkeypatch.setattr(cli.importlib, "import_module", missing)
    assert cli.main(["simulate", "--anything"]) == 2
    assert "`nestflex simulate` needs nestflex.deploy.simulation" in capsys.readouterr().err


def test_inspect_and_bench_show_the_flex_exits(tmp_path):
    info, _, _, _, spec = write_flex_bundle(tmp_path, onnx=False)
    text = cli.inspect_table(nd.load(info["bundle"]))
    assert "flex_exits (3, flexdnn, backbone shared, confidence entropy, fallback final)" in text
    first = spec["exits"][0]
    assert f"{first['location']}  " in text and f"{len(first['filters'])}/32" in text  # top-k of relu3's 32 filters
    assert f"{first['widths']} after 2x2 pooling" in text  # its input is average-pooled first (stem_pool=2)
    result = cli.bench_bundle(nd.load(info["bundle"]), repeats=1)
    assert [e["exit"] for e in result["flex_exits"]] == [0, 1, 2] and all(e["latency_ms"] > 0 for e in result["flex_exits"])
