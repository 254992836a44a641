"""The seed sweep and the pruning-noise benchmark at toy settings, and the sweep's statistics."""

from __future__ import annotations

import json

import pytest

from tests.scripts import TINY, load_script

FLAGS = [*TINY, "--prune-max-steps", "2", "--prune-triplets", "40", "--prune-max-drop", "50",
         "--prune-finetune-epochs", "1"]


def _row(seed, macs, drop, status="max_steps", stages=None):
    return {"seed": seed, "synthetic": True, "baseline_accuracy": 0.87, "seed_macs_fraction": macs,
            "seed_accuracy": round(0.87 - drop / 100, 4), "seed_drop_points": drop, "prune_status": status,
            "stage_seconds": stages or {"baseline": 300.0, "prune": 600.0}}


def test_goal_counts_runs_small_and_accurate_and_needs_five():
    bench = load_script("benchmarks/recipe/recipe_seeds.py")
    rows = [_row(0, 0.32, 0.8), _row(1, 0.30, 1.2), _row(2, 0.40, 0.5), _row(3, 0.35, 1.0), _row(4, 0.33, 0.1)]
    goal = bench.goals(rows, ["baseline", "prune"])["seed_model_small_and_accurate"]
    assert goal["measured"] == "3 of 5 runs (seeds [0, 3, 4])" and goal["met"] is False  # 1.2 points, 40% MACs
    rows[1]["seed_drop_points"] = 0.9
    assert bench.goals(rows, ["baseline", "prune"])["seed_model_small_and_accurate"]["met"] is True
    assert bench.goals(rows[:4], ["prune"])["seed_model_small_and_accurate"]["met"] is False  # 4 of 4 is not 5 runs
    stats = bench.aggregate(rows)
    assert stats["figures"]["seed_macs_fraction"] == {"median": 0.33, "min": 0.30, "max": 0.40, "n": 5}
    assert stats["stage_seconds"]["prune"]["median"] == 600.0 and stats["total_seconds"]["median"] == 900.0
    # the 30-minute goal is only judged on runs of every stage
    assert "recipe_within_30_minutes" not in bench.goals(rows, ["baseline", "prune"])


def test_the_30_minute_goal_is_judged_on_the_median_and_its_note_gives_the_runs_over():
    bench = load_script("benchmarks/recipe/recipe_seeds.py")
    all_stages = ["baseline", "prune", "grow", "exits", "flex", "profile", "export"]
    rows = [_row(s, 0.3, 0.5, stages={"baseline": 60.0 * m}) for s, m in enumerate([28.0, 29.0, 29.5, 30.1, 31.0])]
    goal = bench.goals(rows, all_stages)["recipe_within_30_minutes"]
    assert goal["met"] is True and goal["measured"] == {"median_minutes": 29.5, "max_minutes": 31.0, "runs": 5}
    assert "2 of 5 runs took longer than 30 min (the slowest, seed 4: 31.0 min)" in goal["note"]
    rows[2]["stage_seconds"] = {"baseline": 60.0 * 30.2}  # the median run over 30 min fails the goal
    assert bench.goals(rows, all_stages)["recipe_within_30_minutes"]["met"] is False


def test_sweep_runs_each_seed_in_its_own_directory_then_noise_reads_one(tmp_path):
    bench = load_script("benchmarks/recipe/recipe_seeds.py")
    out, runs = tmp_path / "out", tmp_path / "runs"
    # two seeds at once, one thread each: each run still lands in its own directory with its own seed
    summary = bench.main(["--seeds", "0,1", "--stages", "baseline,prune", "--runs", str(runs), "--out", str(out),
                          "--jobs", "2", "--threads", "1", "--", *FLAGS])
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary)) and (out / "seeds.png").exists()
    assert [r["seed"] for r in on_disk["runs"]] == [0, 1] and on_disk["synthetic"] is True
    assert on_disk["jobs"] == 2 and on_disk["threads_per_run"] == 1
    for r in on_disk["runs"]:
        run = json.loads((runs / f"seed_{r['seed']}" / "summary.json").read_text())
        assert run["data"]["seed"] == r["seed"] and r["seed_macs_fraction"] == run["pruning"]["macs_fraction"]
        assert r["val_size"] == 100 and set(r["stage_seconds"]) == {"baseline", "prune"}
    assert on_disk["figures"]["seed_macs_fraction"]["n"] == 2
    assert not on_disk["goals"]["seed_model_small_and_accurate"]["met"]  # two runs cannot meet a 5-run goal
    # a second call reuses every stage and reports the same times (the ones the stages took)
    again = bench.main(["--seeds", "0,1", "--stages", "baseline,prune", "--runs", str(runs), "--out", str(out),
                        "--", *FLAGS])
    assert [r["stage_seconds"] for r in again["runs"]] == [r["stage_seconds"] for r in on_disk["runs"]]

    # the roadmap table reads the same runs (finished here; a cut-off run would say "running")
    table = load_script("benchmarks/recipe/roadmap_table.py").main(["--sweep", f"default={runs}", "--note", "toy",
                                                             "--out", str(tmp_path / "table")])
    seed0 = table["sweeps"]["default"]["seed_0"]
    assert seed0["status"] == on_disk["runs"][0]["prune_status"] and len(seed0["kept"]) == on_disk["runs"][0]["prune_steps"]
    assert seed0["seed_macs_fraction"] == on_disk["runs"][0]["seed_macs_fraction"]
    assert json.loads((tmp_path / "table" / "summary.json").read_text())["note"] == "toy"

    noise = load_script("benchmarks/pruning/prune_noise.py").main([
        "--run", str(runs / "seed_0"), "--recipe-args", " ".join([*TINY, "--seed", "0"]), "--repeats", "2",
        "--epochs", "1", "--out", str(tmp_path / "noise")])
    val = noise["evaluation"]["val"]
    assert val["n"] == 100 and val["se_drop_paired"] <= val["se_drop_unpaired"]
    assert abs(val["accuracy_a"] - noise["start_accuracy"]) < 1e-9  # the baseline, re-evaluated on the same split
    (epoch,) = noise["retraining"]["per_epoch"]
    assert epoch["extra_epochs"] == 1 and len(noise["retraining"]["runs"]) == 2 and epoch["val_sd"] is not None


def _run_summary(machine, stages, macs=0.3, acc=0.865):
    return {"data": {"synthetic": True}, "machine": machine, "baseline": {"accuracy": 0.87},
            "pruning": {"macs_fraction": macs, "accuracy": acc, "status": "max_steps", "steps": 10},
            "timing": {"stages": stages}}


H200 = {"cpu": "Intel Xeon", "cpus": 16, "torch_threads": 3, "cuda": "NVIDIA H200"}


def test_collect_reads_runs_made_elsewhere_with_the_stages_each_finished(tmp_path):
    bench = load_script("benchmarks/recipe/recipe_seeds.py")
    runs, out = tmp_path / "runs", tmp_path / "out"
    for seed, stages in ((0, {"baseline": 90.0, "prune": 200.0, "grow": 90.0}), (1, {"baseline": 95.0, "prune": 300.0})):
        (runs / f"seed_{seed}").mkdir(parents=True)
        (runs / f"seed_{seed}" / "summary.json").write_text(json.dumps(_run_summary(H200, stages)))
    summary = bench.main(["--collect", "--seeds", "0,1", "--runs", str(runs), "--out", str(out)])
    assert summary["stages"] == ["baseline", "prune"] and summary["collected"] is True  # what every run finished
    assert summary["machine"] == H200 and [r["machine_type"] for r in summary["runs"]] == ["Intel Xeon, 16 cores, NVIDIA H200"] * 2
    assert summary["runs"][0]["machine"] == "Intel Xeon, 16 cores, 3 torch threads, NVIDIA H200"
    assert json.loads((out / "run.json").read_text())["machine"] == "Intel Xeon, 16 cores, NVIDIA H200 (runs read here)"
    with pytest.raises(SystemExit, match=r"--collect: no .*seed_2/summary.json for seed 2. HINT: --runs"):
        bench.main(["--collect", "--seeds", "0,2", "--runs", str(runs), "--out", str(out)])


def test_merge_pools_machine_types_for_nine_of_ten_and_times_each_type_that_ran_it_whole(tmp_path):
    bench = load_script("benchmarks/recipe/recipe_seeds.py")
    amd = {"cpu": "AMD EPYC", "cpus": 2, "torch_threads": 2, "cuda": None}
    whole = dict.fromkeys(bench.ALL_STAGES.split(","), 60.0 * 25 / 7)  # 25 minutes in all
    sweeps = []
    for name, record, stages, macs, flags in (("amd", amd, whole, [0.3] * 5, []),
                                              ("h200", H200, {"prune": 200.0}, [0.3, 0.3, 0.3, 0.3, 0.37],
                                               ["--accelerator", "gpu"])):  # where it ran: still one recipe
        rows = [bench.row(s, _run_summary(record, stages, macs=m)) for s, m in enumerate(macs)]
        path = tmp_path / name / "summary.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"runs": rows, "machine": record, "extra_flags": ["--prune-decision", "paired", *flags],
                                    "stages": list(stages), "goals": bench.goals(rows, list(stages))}))
        sweeps.append(str(path))
    summary = bench.main(["--merge", *sweeps, "--out", str(tmp_path / "out")])
    goal = summary["goals"]["seed_model_across_machines"]
    assert goal["met"] is True and goal["measured"].startswith("9 of 10 runs")
    assert "seed 4 on Intel Xeon, 16 cores, NVIDIA H200 (37.0% of the MACs" in goal["note"]
    time = summary["goals"]["recipe_within_30_minutes_per_machine"]
    assert time["measured"] == {"median_minutes": {"AMD EPYC, 2 cores": 25.0},
                                "not_measured": ["Intel Xeon, 16 cores, NVIDIA H200"]} and time["met"] is True
    assert set(summary["per_machine"]) == {"AMD EPYC, 2 cores", "Intel Xeon, 16 cores, NVIDIA H200"}
    assert summary["extra_flags"] == ["--prune-decision", "paired"]
    other = json.loads(open(sweeps[1]).read()) | {"extra_flags": ["--accelerator", "gpu"]}
    (tmp_path / "h200" / "summary.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="--merge: the sweeps ran different recipe flags"):
        bench.main(["--merge", *sweeps, "--out", str(tmp_path / "out")])


def test_merge_times_each_run_under_its_own_machine_type(tmp_path):
    """One sweep whose runs came from two machine types: each run's whole-recipe time counts for its type."""
    bench = load_script("benchmarks/recipe/recipe_seeds.py")
    amd = {"cpu": "AMD EPYC", "cpus": 2, "torch_threads": 2, "cuda": None}
    stages = bench.ALL_STAGES.split(",")
    rows = [bench.row(s, _run_summary(rec, dict.fromkeys(stages, 60.0 * m / 7)))
            for s, (rec, m) in enumerate([(amd, 20.0), (amd, 21.0), (H200, 5.0), (H200, 6.0), (H200, 7.0)])]
    path = tmp_path / "mixed" / "summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"runs": rows, "machine": amd, "extra_flags": [], "stages": stages,
                                "goals": bench.goals(rows, stages)}))
    time = bench.main(["--merge", str(path), "--out", str(tmp_path / "out")])["goals"]["recipe_within_30_minutes_per_machine"]
    assert time["measured"]["median_minutes"] == {"AMD EPYC, 2 cores": 20.5, "Intel Xeon, 16 cores, NVIDIA H200": 6.0}


def test_each_run_gives_its_validation_drop_and_the_sweep_the_gap_to_test():
    """What the test split adds to the drop the roadmap judged on validation: per run, and its mean and
    spread over the runs (docs/pruning.md#confirming-the-seed)."""
    bench = load_script("benchmarks/recipe/recipe_seeds.py")
    rows = []
    for seed, (val, acc) in enumerate(((0.868, 0.860), (0.872, 0.869), (0.870, 0.866))):
        s = _run_summary(H200, {"baseline": 90.0}, acc=acc)
        s["pruning"] |= {"start_val_accuracy": 0.875, "val_accuracy": val}
        rows.append(bench.row(seed, s))
    assert [(r["seed_val_drop_points"], r["seed_drop_points"], r["seed_drop_gap_points"]) for r in rows] == [
        (0.7, 1.0, 0.3), (0.3, 0.1, -0.2), (0.5, 0.4, -0.1)]
    gap = bench.aggregate(rows)["figures"]["seed_drop_gap_points"]
    assert gap["mean"] == 0.0 and gap["sd"] == 0.265 and (gap["min"], gap["max"]) == (-0.2, 0.3)
    del rows[0]["seed_drop_gap_points"], rows[1]["seed_drop_gap_points"]  # runs from before the field: no spread of one
    assert "sd" not in bench.aggregate(rows)["figures"]["seed_drop_gap_points"]
