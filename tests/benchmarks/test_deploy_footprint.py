"""benchmarks/deploy/deploy_footprint.py's pure helpers (the benchmark itself builds a venv and runs two
runtimes: it is run by hand, docs/results/deploy_footprint/README.md)."""

from __future__ import annotations

import doctest

import pytest

from tests.scripts import load_script

bench = load_script("benchmarks/deploy/deploy_footprint.py")
child = load_script("benchmarks/deploy/_footprint_child.py")

STATUS = """Name:\tpython3
Umask:\t0022
State:\tS (sleeping)
VmPeak:\t  412345 kB
VmHWM:\t   45012 kB
VmRSS:\t   43908 kB
RssAnon:\t   20100 kB
RssFile:\t   23800 kB
RssShmem:\t       8 kB
Threads:\t4
"""


def test_doctests():
    for module in (bench, child):
        assert doctest.testmod(module).failed == 0


def test_proc_status_fields_in_bytes():
    got = child.parse_proc_status(STATUS)
    assert got == {"VmHWM": 45012 * 1024, "VmRSS": 43908 * 1024, "RssAnon": 20100 * 1024,
                   "RssFile": 23800 * 1024, "RssShmem": 8 * 1024}
    assert child.parse_proc_status("Name:\tx\n") == {}
    assert child.parse_proc_status(STATUS, ("VmRSS",)) == {"VmRSS": 43908 * 1024}
    with pytest.raises(ValueError, match=r"field 'VmRSS': expected '<int> kB', got '12 MB'"):
        child.parse_proc_status("VmRSS:\t12 MB\n")


def test_this_process_status_is_read():
    got = child.proc_status()
    assert got["VmHWM"] >= got["VmRSS"] > 0


def test_site_packages_split_into_what_nestflex_brings_and_venv_tooling(tmp_path):
    def put(rel: str, size: int) -> None:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)

    put("numpy/core.so", 1000)
    put("numpy/sub/a.py", 10)
    put("numpy.libs/openblas.so", 500)
    put("numpy-2.4.6.dist-info/RECORD", 5)
    put("pip/__init__.py", 300)
    put("pip-23.2.1.dist-info/RECORD", 3)
    put("setuptools/__init__.py", 200)
    put("pkg_resources/__init__.py", 50)
    put("_distutils_hack/__init__.py", 7)
    put("distutils-precedence.pth", 2)
    put("typing_extensions.py", 40)
    sizes = bench.entry_sizes(tmp_path)
    assert sizes["numpy"] == 1010 and sizes["distutils-precedence.pth"] == 2
    brought, tools = bench.split_tooling(sizes)
    assert brought == {"numpy": 1515, "typing_extensions": 40}
    assert tools == {"pip": 303, "setuptools": 200, "pkg_resources": 50, "_distutils_hack": 7,
                     "distutils-precedence.pth": 2}


def test_latency_ratios_take_the_median_over_back_to_back_pairs():
    def run(*ms):
        return {"1": [{"level": k, "backend": "ort", "ms": v} for k, v in enumerate(ms)]}

    table = bench.ratio_table([run(1.0, 2.2), run(1.2, 2.0), run(9.0, 2.1)],
                              [run(1.0, 2.0), run(1.0, 2.0), run(1.0, 2.0)])
    (l0, l1) = table["batches"]["1"]
    assert (l0["new_ms"], l0["old_ms"], l0["ratio"]) == (1.2, 1.0, 1.2)  # one preempted process does not count
    assert (l1["new_ms"], l1["ratio"], l1["ratio_per_pair"]) == (2.1, 1.05, [1.1, 1.0, 1.05])
    assert table["worst_ratio"] == 1.2 and l0["new_ms_per_process"] == [1.0, 1.2, 9.0]
    # a slow minute that hits both processes of a pair cancels out in its ratio, not in the medians
    slow = bench.ratio_table([run(1.0), run(2.0), run(2.0)], [run(1.0), run(2.0), run(1.0)])["batches"]["1"][0]
    assert (slow["ratio"], slow["ratio_of_medians"]) == (1.0, 2.0)


def test_exit_set_times_take_the_median_over_pairs_and_skip_pairs_with_an_error():
    new = [{"exits": {"8": 2.0, "1": 0.3}}, {"exits": {"8": 3.0, "1": 0.4}}, {"error": "ValueError: x"}]
    old = [{"exits": {"8": 4.0, "1": 0.3}}, {"exits": {"8": 4.0, "1": 0.2}}, {"exits": {"8": 1.0, "1": 0.1}}]
    table = bench.exit_ratio_table(new, old)
    assert table["pairs"] == 2 and table["errors"] == ["new: ValueError: x"]
    assert table["sets"]["exits"]["8"] == {"new_ms": 2.5, "old_ms": 4.0, "ratio": 0.625}
    assert table["sets"]["exits"]["1"]["ratio"] == 1.5  # pairs 1.0 and 2.0
    assert bench.exit_ratio_table([{"error": "e"}], [{"error": "e"}]) == {"sets": {}, "pairs": 0,
                                                                          "errors": ["new: e", "old: e"]}


def test_the_worst_switch_is_the_worst_pairs_median():
    pairs = [{"from": 0, "to": 1, "median_ms": 0.5, "max_ms": 9.0}, {"from": 1, "to": 0, "median_ms": 1.5, "max_ms": 2.0}]
    assert bench.worst_switch(pairs) == {"worst_median_ms": 1.5, "worst_pair": [1, 0], "slowest_single_ms": 9.0,
                                         "slowest_pair": [0, 1]}


def test_answers_differ_by_exit_answer_or_class():
    def side(exit_index, answer_index, prediction, logits):
        mode = {"exit_index": exit_index, "answer_index": answer_index, "prediction": prediction, "logits": logits}
        return {"samples": len(prediction), "exits": {"batched": mode, "single": mode}}

    same = side([0, 2], [0, 1], [3, 4], [[0.5, 1.0], [2.0, 0.0]])
    assert bench.compare_answers(same, same)["differing"] == 0
    other = side([0, 2], [0, 2], [3, 4], [[0.5, 1.25], [2.0, 0.0]])
    got = bench.compare_answers(other, same)
    assert got["differing"] == 2  # sample 1's answering exit, batched and single
    assert got["sets"]["exits.batched"] == {"samples": 2, "differing": 1, "max_logit_diff": 0.25}
    assert bench.compare_answers({**same, "flex_exits": same["exits"]}, same)["missing_sets"] == ["flex_exits"]


def test_arguments_are_checked(tmp_path, capsys):
    (tmp_path / "b.nfx").mkdir()
    with pytest.raises(SystemExit):
        bench.parse_args(["--bundle", str(tmp_path / "b.nfx"), "--out", str(tmp_path)])
    assert "is not a bundle (no manifest.json)" in capsys.readouterr().err
    (tmp_path / "b.nfx" / "manifest.json").write_text("{}")
    with pytest.raises(SystemExit):
        bench.parse_args(["--bundle", str(tmp_path / "b.nfx"), "--out", str(tmp_path), "--processes", "0"])
    assert "--processes must be >= 1, got 0" in capsys.readouterr().err
    args = bench.parse_args(["--bundle", str(tmp_path / "b.nfx"), "--out", str(tmp_path)])
    assert args.processes == 7 and args.previous == "2a8fdf1"
