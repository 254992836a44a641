"""The `nestflex` CLI (python -m nestflex) on a tiny bundle, in subprocesses."""

import json
import subprocess
import sys

import pytest

import nestflex.deploy as nd
from nestflex import cli
from nestflex.capacity.profile import profile_levels
from nestflex.export import export_bundle
from tests.export.bundles import exits_on, nested_vgg, write_bundle, write_flex_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    info, _, _ = write_bundle(tmp_path_factory.mktemp("cli"), onnx=False)
    return info["bundle"]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "nestflex", *args], capture_output=True, text=True)


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


def test_inspect_and_bench_show_the_flex_exits(tmp_path):
    info, _, _, _, spec = write_flex_bundle(tmp_path, onnx=False)
    text = cli.inspect_table(nd.load(info["bundle"]))
    assert "flex_exits (3, flexdnn, backbone shared, confidence entropy, fallback final)" in text
    first = spec["exits"][0]
    assert f"{first['location']}  " in text and f"{len(first['filters'])}/32" in text  # top-k of relu3's 32 filters
    assert f"{first['widths']} after 2x2 pooling" in text  # its input is average-pooled first (stem_pool=2)
    result = cli.bench_bundle(nd.load(info["bundle"]), repeats=1)
    assert [e["exit"] for e in result["flex_exits"]] == [0, 1, 2] and all(e["latency_ms"] > 0 for e in result["flex_exits"])


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    net = nested_vgg(tmp)
    rows = profile_levels(net, None, batch_sizes=(1,), repeats=1, input_shape=(3, 32, 32))
    info = export_bundle(tmp / "model.nfx", net, exits=exits_on(net), thresholds=[0.5, 0.6], onnx=False,
                         levels=[{**r, "accuracy": a} for r, a in zip(rows, [0.7, 0.8, 0.85])])
    return info["bundle"]


def test_run_serves_bundles_live_and_prints_a_table_per_app(profiled, tmp_path, capsys):
    out = tmp_path / "run.json"
    assert cli.main(["run", profiled, profiled, "--seconds", "1.2", "--interval", "0.5", "--fps", "40",
                     "--memory-mb", "5", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "scheduler greedy_total" in text and "model-2" in text and "exp. accuracy" in text
    stats = json.loads(out.read_text())
    assert set(stats["apps"]) == {"model", "model-2"}
    assert all(a["answered"] > 0 for a in stats["apps"].values())
    assert stats["resident_bytes"] <= 5e6


def test_run_refuses_a_budget_no_app_fits_in_one_line(profiled, capsys):
    assert cli.main(["run", profiled, "--seconds", "1", "--memory-mb", "0.001"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: app 'model' does not fit: `memory_mb`=0.001")
    assert cli.main(["run", profiled, "--fps", "0"]) == 2
