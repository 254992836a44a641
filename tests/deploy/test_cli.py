"""The `nestflex` CLI (python -m nestflex) on a tiny bundle, in subprocesses that have no torch, no
training package and no onnx (the base install: tests/deploy/blocked.py)."""

import json

import pytest

import nestflex.deploy as nd
from nestflex import cli
from nestflex.capacity.profile import profile_levels
from nestflex.export import export_bundle
from tests.deploy.blocked import BLOCKER, run_blocked
from tests.export.bundles import exits_on, nested_vgg, write_bundle, write_flex_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    info, _, _ = write_bundle(tmp_path_factory.mktemp("cli"), onnx=False)
    return info["bundle"]


def _run(*args):
    """``python -m nestflex ARGS`` on the base install; asserts it never tried to import torch or a
    training package (onnx only to build the optional fused early-exit graph, which it then does
    without), and returns the finished process (its stderr without that report)."""
    out = run_blocked(f"""
        import json, runpy
        sys.argv = ["nestflex", *{list(args)!r}]
        try:
            runpy.run_module("nestflex", run_name="__main__", alter_sys=True)
        finally:
            print("\\n@@" + json.dumps({{"attempts": ATTEMPTS, "loaded": loaded()}}), file=sys.stderr)
    """)
    err, _, report = out.stderr.rpartition("\n@@")
    report = json.loads(report)
    assert set(report["attempts"]) <= {"onnx"} and report["loaded"] == [], f"`nestflex {args[0]}` tried {report}"
    out.stderr = err.strip()
    return out


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


def test_run_serves_bundles_live_and_prints_a_table_per_app(profiled, tmp_path):
    out = tmp_path / "run.json"
    done = _run("run", profiled, profiled, "--seconds", "1.2", "--interval", "0.5", "--fps", "40", "--memory-mb", "5",
                "--json", str(out))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "scheduler greedy_total" in text and "model-2" in text and "exp. accuracy" in text
    stats = json.loads(out.read_text())
    assert set(stats["apps"]) == {"model", "model-2"}
    assert all(a["answered"] > 0 for a in stats["apps"].values())
    assert stats["resident_bytes"] <= 5e6


def test_run_refuses_a_budget_no_app_fits_in_one_line(profiled, tmp_path, capsys):
    out = _run("run", profiled, "--seconds", "1", "--memory-mb", "0.001")
    err = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(err) == 1 and err[0].startswith("error: app 'model' does not fit: `memory_mb`=0.001")
    out = _run("run", str(tmp_path / "missing.nfx"), "--seconds", "1")
    assert out.returncode == 2 and out.stderr.startswith("error: app 'missing': its bundle failed to load: bundle ")
    assert cli.main(["run", profiled, "--fps", "0"]) == 2
    assert "--fps must be > 0, got 0.0" in capsys.readouterr().err


def test_tune_runs_on_the_base_install_against_the_program_reference(bundle, tmp_path):
    """No torch: the reference is onnxruntime on the graphs written from the program; no onnx: the
    padded candidates cannot be built, and their rows say which package and extra they need."""
    plan_file = tmp_path / "plan.json"
    out = _run("tune", bundle, "--threads", "1", "--repeats", "1", "--backends", "onnxruntime", "onnxruntime_pad8",
               "--out", str(plan_file))
    assert out.returncode == 0, out.stderr
    assert "onnxruntime_program 1-thread ms" in out.stdout and f"plan: {plan_file}" in out.stdout
    plan = json.loads(plan_file.read_text())
    assert plan["reference"] == "onnxruntime_program" and plan["machine"]["torch"] is None
    assert all(lp["backend"] in ("onnxruntime", "onnxruntime_program") for lp in plan["levels"])
    rows = [c for c in plan["candidates"] if c.get("level") is not None]
    assert {c["backend"] for c in rows} == {"onnxruntime_program", "onnxruntime", "onnxruntime_pad8"}
    for c in rows:
        if c["backend"] == "onnxruntime_pad8":
            assert "needs the `onnx` package" in c["error"] and "nestflex[tune]" in c["error"]
        else:  # the shipped-or-written graph against the program's: both written here (onnx=False), equal
            assert c["agrees"] and c["max_abs_diff"] <= 1e-4
    assert plan["exits"]["exits"]["backend"] in ("onnxruntime", "onnxruntime_program")
    assert not (nd.load(bundle).path.parent / (nd.load(bundle).path.name + ".plan.json")).exists()  # only --out


def test_serve_listens_and_stops_on_sigint_on_the_base_install(bundle):
    """`nestflex serve` (the serve extra's gRPC, no torch): it prints where it listens, and SIGINT
    stops it cleanly."""
    import signal
    import subprocess
    import sys
    import textwrap

    import grpc  # noqa: F401  (`nestflex serve` needs the serve extra, which dev installs: fail if missing)
    code = BLOCKER + textwrap.dedent(f"""
        import json, runpy
        sys.argv = ["nestflex", "serve", {bundle!r}, "--port", "0"]
        try:
            runpy.run_module("nestflex", run_name="__main__", alter_sys=True)
        finally:
            print("@@" + json.dumps({{"attempts": ATTEMPTS, "loaded": loaded()}}), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("nestflex serve: listening on 127.0.0.1:"), (first, proc.stderr.read() if
                                                                               proc.poll() is not None else "")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1].removeprefix("@@"))
    assert set(report["attempts"]) <= {"onnx"} and report["loaded"] == [], report
