"""Write ``docs/results/index.md`` and the table of ``benchmarks/README.md`` from the runs' ``run.json``.

    python benchmarks/results_index.py            # writes both
    python benchmarks/results_index.py --check    # exit 1, saying why, if a run.json is wrong or a file is stale

``docs/results/<benchmark>/<run>/`` holds one run: ``summary.json``, its plots and ``run.json``
(:func:`benchmarks._common.write_run`). :data:`BENCHMARKS` says, per benchmark (the script or
recipe that writes it), which question it answers, which docs page discusses it and which figure
of its current run's ``summary.json`` heads the index. Every benchmark has exactly one
``"current"`` run; the others are ``{"superseded_by": "<benchmark>/<run>"}`` or
``{"variant_of": "<benchmark>/<run>"}``; a run still ``"new"`` fails the check until someone
decides. tests/docs/test_results_index.py runs the check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import RESULTS, ROOT

INDEX = RESULTS / "index.md"
README = ROOT / "benchmarks" / "README.md"
README_BEGIN, README_END = "<!-- results_index:begin -->", "<!-- results_index:end -->"
RUN_KEYS = ("benchmark", "run", "command", "commit", "date", "machine", "status")
GROUPS = ("pruning", "capacity", "exits", "synthesis", "split", "engine", "deploy", "zoo", "recipe", "recipes")


@dataclass(frozen=True)
class Benchmark:
    """What the index says about one benchmark."""

    script: str  # from the repository root
    question: str
    docs: str  # the page that discusses it, under docs/
    headline: Callable[[dict[str, Any]], str]  # the current run's summary.json -> one line
    # why a benchmark that is written and tested has no run yet (the run it needs, and what stopped
    # it); listed as such in the index, and an error once a run exists
    pending: str | None = None

    @property
    def group(self) -> str:
        parts = Path(self.script).parts
        return parts[1] if parts[0] == "benchmarks" else "recipes"


def _goals(s: dict[str, Any]) -> str:
    goals = s["goals"]
    met = [k for k, g in goals.items() if g["met"]]
    missed = [f"`{k}`" for k in goals if k not in met]
    return f"goals met {len(met)} of {len(goals)}" + (f" (not: {', '.join(missed)})" if missed else "")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _per_bundle(measured: dict[str, Any]) -> Any:
    (value,) = measured.values()  # the current runs measure one bundle
    return value


BENCHMARKS: dict[str, Benchmark] = {
    # pruning
    "pruning_roadmaps": Benchmark(
        "benchmarks/pruning/pruning_roadmaps.py", "How small does TRR prune a model, against L1, on the same schedule?",
        "pruning.md", lambda s: f"TRR seed at {_pct(s['targets']['trr_seed_macs_fraction'])} of the MACs, "
                                f"L1 at {_pct(s['targets']['l1_seed_macs_fraction'])}"),
    "pruning_sensitivity": Benchmark(
        "benchmarks/pruning/pruning_sensitivity.py", "Does TRR rank filters better than L1, L2 and random?",
        "pruning.md", lambda s: f"TRR at least as good as L1 on {s['trr_at_least_as_good']['trr_vs_l1']} of "
                                f"{s['points_compared']} points"),
    "prune_noise": Benchmark(
        "benchmarks/pruning/prune_noise.py", "How noisy is a pruning step's verdict, and what do more epochs buy?",
        "pruning.md", lambda s: f"the seed's test drop {100 * s['evaluation']['test']['drop']:.2f} points, paired SE "
                                f"{100 * s['evaluation']['test']['se_drop_paired']:.2f}"),
    "keep_reject": Benchmark(
        "benchmarks/pruning/keep_reject.py", "How often does the keep/reject rule get a step near the goal wrong?",
        "pruning.md", lambda s: f"false rejects at the goal: threshold {_pct(s['false_reject']['threshold']['0.0'])}, "
                                f"paired {_pct(s['false_reject']['paired']['0.0'])}; false keeps 0.5 point below: "
                                f"{_pct(s['false_keep']['threshold']['0.5'])} / {_pct(s['false_keep']['paired']['0.5'])}"),
    "trr_cost": Benchmark(
        "benchmarks/pruning/trr_cost.py", "What does TRR ranking cost against one forward pass?",
        "pruning.md", lambda s: f"TRR {s['trr_over_forward']}x a forward pass, {s['trr_over_l1']:.0f}x L1"),
    # capacity
    "freeze_grow": Benchmark(
        "benchmarks/capacity/freeze_grow.py",
        "Do nested levels match independent and from-scratch models, in one model's memory?",
        "capacity.md", lambda s: f"{s['targets']['levels_within_1pt_of_independent']} levels within 1 point of "
                                 f"independent, {s['targets']['levels_above_scratch']} above scratch; "
                                 f"{s['memory']['ratio_to_largest']:.3f}x the largest level's memory"),
    "width_latency": Benchmark(
        "benchmarks/capacity/width_latency.py", "Which widths make a level's time follow its MACs on this CPU?",
        "engine.md", lambda s: "smallest level's time share at width " + ", ".join(
            f"{r['width']:g}: {r['time_fraction']:.2f} for {r['macs_fraction']:.2f} of the MACs"
            for r in s["rows"] if r["level"] == 0)),
    # exits
    "exits_tradeoff": Benchmark(
        "benchmarks/exits/exits_tradeoff.py", "How many MACs do early exits save at the backbone's accuracy?",
        "exits.md", lambda s: "joint exits within 1 point of the backbone at "
                              f"{_pct(s['variants']['joint']['target_vs_backbone_alone']['cheapest_within_1pt']['mean_macs_fraction'])}"
                              " of its MACs"),
    "exits_loss_ablation": Benchmark(
        "benchmarks/exits/exits_loss_ablation.py", "Which multi-exit loss weighting trains the best exits?",
        "exits.md", lambda s: "final exit " + ", ".join(f"{k} {_pct(v['final_exit_accuracy'])}"
                                                        for k, v in s["variants"].items())),
    "exits_throughput": Benchmark(
        "benchmarks/exits/exits_throughput.py", "Is batched early exit faster than per-sample on a CPU?",
        "exits.md", lambda s: f"backbone alone {s['backbone_alone']['batched_samples_per_s']:.0f} images/s batched; "
                              f"at threshold {s['thresholds'][0]['threshold']} early exit "
                              f"{s['thresholds'][0]['batched_over_per_sample']:.2f}x per-sample"),
    "flex_min_filters": Benchmark(
        "benchmarks/exits/flex_min_filters.py", "Does collective ranking find more redundant filters than L2?",
        "flexdnn.md", lambda s: f"redundant filters: collective {s['redundant_total']['collective']}, "
                                f"L2 {s['redundant_total']['l2']} ({100 * s['more_redundant_found']:+.1f}%)"),
    "flex_plan": Benchmark(
        "benchmarks/exits/flex_plan.py", "Does a FlexDNN plan need fewer MACs than equal-MAC exits at the same accuracy?",
        "flexdnn.md", lambda s: "median saving " + " / ".join(_pct(m["flex_saving"]) for m in s["matched_accuracy"])
                                + " at -" + " / -".join(f"{100 * m['drop']:g}" for m in s["matched_accuracy"])
                                + " points; 15% target " + ("met" if s["target_15pct"] else "not met")),
    "collective_cost": Benchmark(
        "benchmarks/exits/collective_cost.py", "What does collective ranking cost against the naive per-filter refits?",
        "flexdnn.md", lambda s: ", ".join(f"{r['speedup_vs_naive_estimate']}x faster for {r['filters']} filters"
                                          for r in s["layers"])),
    # synthesis
    "synthesis": Benchmark(
        "benchmarks/synthesis/synthesis.py", "How much faster does a synthesised execution plan run each level?",
        "synthesis.md", lambda s: f"largest level {_per_bundle(s['goals']['largest_level_float32']['measured']):.1f}x "
                                  f"eager; {_goals(s)}"),
    "level_profile": Benchmark(
        "benchmarks/synthesis/level_profile.py", "Where does a level's time go, operator by operator?",
        "synthesis.md", lambda s: "largest level's time in layers that do not shrink: " + ", ".join(
            f"{b} {_pct(v[-1]['not_shrinking_share_of_largest'])}" for b, v in s["backends"].items())),
    "layer_precision": Benchmark(
        "benchmarks/synthesis/layer_precision.py", "Which layers can run in int8 or bfloat16 within an accuracy budget?",
        "profiling.md", lambda s: f"{s['headline'][0]['counts']['int8']} of {sum(s['headline'][0]['counts'].values())}"
                                  f" layers int8 within {s['headline'][0]['budget_points']:g} point: "
                                  f"{s['headline'][0]['speedup']['64']:.2f}x at batch 64"),
    # split
    "codec": Benchmark(
        "benchmarks/split/codec.py", "How small and fast are ISQuant codec frames of real activations?",
        "codec.md", lambda s: f"4-bit frames {s['headline']['batched']['ratio_4bit']['median']:.1f}x smaller than "
                              f"float32 (median over splits), packed at "
                              f"{s['headline']['batched']['pack_mb_s_4bit']['median']:.0f} MB/s on one core"),
    "split_heatmap": Benchmark(
        "benchmarks/split/split_heatmap.py", "How few bits does each split point need?",
        "profiling.md", lambda s: "lowest bitwidth within 1 point: " + ", ".join(
            sorted({str(v["lowest_bits"]["1"]) for v in s["splits"].values()}, key=int)) + " bits over the splits"),
    "split_live": Benchmark(
        "benchmarks/split/split_live.py", "Does split inference beat device-only and the baselines, live?",
        "split.md", lambda s: f"{_goals(s)}; {s['goals']['vs_neurosurgeon_mid_bandwidth']['measured']:.2f}x "
                              "Neurosurgeon-style at 5 Mbit/s"),
    # engine
    "scheduler": Benchmark(
        "benchmarks/engine/scheduler.py", "How fast and how close to optimal is the NestDNN scheduler?",
        "scheduler.md", lambda s: f"greedy_total decides in {s['decision_ms_6x5']['greedy_total']:.2f} ms "
                                  f"(6 apps x 5 levels), median gap {_pct(s['optimality_gap']['greedy_total']['median'])}"),
    "joint_scheduler": Benchmark(
        "benchmarks/engine/joint_scheduler.py", "How fast and how close to optimal is the joint scheduler?",
        "scheduler.md", lambda s: f"median decision {s['decision_ms']['median']:.2f} ms; {_goals(s)}"),
    "joint_live": Benchmark(
        "benchmarks/engine/joint_live.py",
        "Does one joint scheduler beat each single-knob scheduler live (apps, CPU load, link trace, tail server)?",
        "engine.md", _goals),
    "cpu_wait": Benchmark(
        "benchmarks/engine/cpu_wait.py", "Does the online profiler see another process taking the CPU?",
        "engine.md", lambda s: "slowdown rise under busy processes, call only / with the wait: " + ", ".join(
            f"{k} {s['goals']['slowdown_sees_contention']['call_only'][k]:.2f}x / {v:.2f}x"
            for k, v in s["goals"]["slowdown_sees_contention"]["measured"].items())),
    "multitenant": Benchmark(
        "benchmarks/engine/multitenant.py", "Does NestDNN's scheduler beat the status quo in a replay of its protocol?",
        "scheduler.md", lambda s: "knee of the sweep (measured latencies): "
                                  f"{s['results']['measured']['comparison']['total']['knee']['frame_rate_speedup']:.2f}x"
                                  " the frame rate, "
                                  f"{s['results']['measured']['comparison']['total']['knee']['accuracy_gain_pct']:+.2f}"
                                  " points"),
    "multitenant_live": Benchmark(
        "benchmarks/engine/multitenant_live.py", "Does the live engine beat the status quo for apps sharing a device?",
        "engine.md", lambda s: f"{s['goals']['vs_status_quo']['measured']['frame_rate_speedup']:.2f}x the frames, "
                               f"{s['goals']['vs_status_quo']['measured']['accuracy_gain_points']:+.1f} points; "
                               f"{_goals(s)}"),
    # deploy
    "deploy_footprint": Benchmark(
        "benchmarks/deploy/deploy_footprint.py", "What does the light runtime cost a device (size, memory, start-up)?",
        "deploy.md", lambda s: f"{s['goals']['installed_size']['measured']} MB installed, RSS after a run "
                               f"{_per_bundle(s['goals']['rss_after_run']['measured'])} MB; {_goals(s)}"),
    "fuzz": Benchmark(
        "benchmarks/deploy/fuzz.py", "Do damaged frames and bundles always get the project's own error, quickly?",
        "deploy.md", lambda s: f"{s['frames']['inputs']:,} frames and {s['bundles']['inputs']:,} bundles; {_goals(s)}"),
    # zoo
    "zoo_coverage": Benchmark(
        "benchmarks/zoo/zoo_coverage.py", "Which zoo models does the structure graph trace, prune and keep correct?",
        "architecture.md", lambda s: f"{s['passed']}/{s['models']} {s['zoo']} models pass every step "
                                     f"(Torch-Pruning {s['goals']['above_torch_pruning']['measured']['torch_pruning']})"),
    "time_vs_macs": Benchmark(
        "benchmarks/synthesis/time_vs_macs.py",
        "Do levels and exits save the time their MACs say on 224x224 models (MACs- and latency-driven)?",
        "synthesis.md", _goals),
    "latency_roadmap": Benchmark(
        "benchmarks/recipe/latency_roadmap.py",
        "Does planning the default recipe's roadmap in measured time give a faster seed at the same accuracy?",
        "pruning.md", lambda s: (f"{'' if s.get('complete', True) else 'PARTIAL, '}"
                                 f"seed {s['goals']['seed_speedup']['measured']}x faster, "
                                 f"{s['goals']['seed_accuracy']['measured']:+} points over "
                                 f"{len(s['seeds'])} of {s.get('seeds_wanted', len(s['seeds']))} seeds; {_goals(s)}")),
    "grouping_vs_torch_pruning": Benchmark(
        "benchmarks/zoo/grouping_vs_torch_pruning.py", "Do nestflex's channel groups agree with Torch-Pruning's?",
        "architecture.md", lambda s: f"identical groups on {sum(r['identical'] for r in s['rows'])} of "
                                     f"{len(s['rows'])} models"),
    # recipe
    "recipe_seeds": Benchmark(
        "benchmarks/recipe/recipe_seeds.py", "How much do the default recipe's figures move between seeds?",
        "pruning.md", lambda s: f"seed model {_pct(s['figures']['seed_macs_fraction']['median'])} of the MACs "
                                f"[{_pct(s['figures']['seed_macs_fraction']['min'])}, "
                                f"{_pct(s['figures']['seed_macs_fraction']['max'])}] over {len(s['runs'])} seeds; "
                                f"{_goals(s)}"),
    "roadmap_table": Benchmark(
        "benchmarks/recipe/roadmap_table.py", "Which pruning step rule holds the goal over seeds (sweeps cut off or not)?",
        "pruning.md", lambda s: f"{len(s['sweeps'])} sweeps: " + ", ".join(s["sweeps"])),
    "synthetic_difficulty": Benchmark(
        "benchmarks/recipe/synthetic_difficulty.py", "How hard is the synthetic dataset the recipes default to?",
        "data.md", lambda s: f"VGG-16 x0.25 test accuracy {_pct(s['results']['test_accuracy'])}; hardest quintile "
                             f"{_pct(s['results']['test_accuracy_per_difficulty_quintile'][-1]['accuracy'])}"),
    # the recipes' own runs (copied from their --out)
    "vgg_cifar": Benchmark(
        "recipes/vgg_cifar.py", "What does the whole default recipe give, stage by stage?",
        "recipes.md", lambda s: f"baseline {_pct(s['baseline']['accuracy'])}, seed at "
                                f"{_pct(s['pruning']['macs_fraction'])} of the MACs, {len(s['levels'])} levels in "
                                f"{s['memory']['ratio_to_largest']:.3f}x the largest level; "
                                f"{s['timing']['seconds'] / 60:.1f} min"),
    "progressive_cifar": Benchmark(
        "recipes/progressive_cifar.py", "What do SPINN's progressive exits on a ResNet-56 give?",
        "recipes.md", lambda s: f"lossless thresholds {_pct(s['exits']['lossless']['accuracy'])} at "
                                f"{_pct(s['exits']['lossless']['macs_fraction'])} of the MACs"),
}


# --- reading and checking the runs ----------------------------------------------------------------

def runs(root: Path = RESULTS) -> dict[str, dict[str, dict[str, Any]]]:
    """``{benchmark: {run: run.json}}`` for every ``<benchmark>/<run>/run.json`` (unparsable ones as ``{}``)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(root.glob("*/*/run.json")):
        try:
            record = json.loads(path.read_text())
        except ValueError:
            record = {}
        out.setdefault(path.parent.parent.name, {})[path.parent.name] = record
    return out


def _status_problem(status: Any, found: dict[str, dict[str, dict[str, Any]]]) -> str | None:
    if status == "current":
        return None
    if status == "new":
        return ('status "new": decide, then make it "current" (and mark the old current run superseded_by it) '
                'or {"superseded_by": ...} or {"variant_of": ...}')
    if isinstance(status, dict) and len(status) == 1 and next(iter(status)) in ("superseded_by", "variant_of"):
        (target,) = status.values()
        b, _, r = str(target).partition("/")
        if r and r in found.get(b, {}):
            return None
        return f"status points to {target!r}, which is no run (<benchmark>/<run> with a run.json)"
    return f'status {status!r}: "current", {{"superseded_by": "<benchmark>/<run>"}} or {{"variant_of": ...}}'


def problems(root: Path = RESULTS) -> list[str]:
    """Everything wrong with the runs under ``root``, one line each (nothing: ``[]``)."""
    found, out = runs(root), []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        for child in sorted(d.iterdir()):
            if child.is_dir() and not (child / "run.json").is_file():
                out.append(f"{child.relative_to(root)}: a run folder without run.json")
            elif child.is_file() and child.name != "README.md":
                out.append(f"{child.relative_to(root)}: a file beside the runs (only README.md belongs there)")
        if d.name not in found:
            out.append(f"{d.name}: no run")
    for b, rs in found.items():
        if b not in BENCHMARKS:
            out.append(f"{b}: not in benchmarks/results_index.py's BENCHMARKS")
        current = [r for r, rec in rs.items() if rec.get("status") == "current"]
        if len(current) != 1:
            out.append(f"{b}: {len(current)} current runs ({', '.join(current) or 'none'}), exactly one wanted")
        for r, rec in rs.items():
            where = f"{b}/{r}/run.json"
            missing = [k for k in RUN_KEYS if k not in rec]
            if missing:
                out.append(f"{where}: missing {', '.join(missing)}")
                continue
            if (rec["benchmark"], rec["run"]) != (b, r):
                out.append(f"{where}: names {rec['benchmark']}/{rec['run']}, not its folder")
            for k in ("command", "commit", "machine"):
                if not isinstance(rec[k], str) or not rec[k].strip():
                    out.append(f"{where}: {k} is empty (write \"not recorded\" when it is unknown)")
            if not (rec["date"] == "not recorded" or re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(rec["date"]))):
                out.append(f"{where}: date {rec['date']!r} is not YYYY-MM-DD")
            if (why := _status_problem(rec["status"], found)) is not None:
                out.append(f"{where}: {why}")
            if rec["status"] == "current" and not (root / b / r / "summary.json").is_file():
                out.append(f"{where}: the current run has no summary.json for the index's headline")
    for b, entry in BENCHMARKS.items():
        if b not in found and entry.pending is None:
            out.append(f"{b}: in BENCHMARKS but no run under {root.name}/")
        if b in found and entry.pending is not None:
            out.append(f"{b}: has a run but is marked pending in BENCHMARKS: drop its `pending`")
        if not (ROOT / entry.script).is_file():
            out.append(f"{b}: script {entry.script} does not exist")
        if not (ROOT / "docs" / entry.docs).is_file():
            out.append(f"{b}: docs page docs/{entry.docs} does not exist")
    return out


# --- writing ----------------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _current(rs: dict[str, dict[str, Any]]) -> str:
    (name,) = [r for r, rec in rs.items() if rec.get("status") == "current"]
    return name


def _others(b: str, rs: dict[str, dict[str, Any]]) -> str:
    parts = []
    for r, rec in sorted(rs.items()):
        status = rec["status"]
        if status == "current":
            continue
        (kind, target), = status.items()
        word = "superseded by" if kind == "superseded_by" else "variant of"
        short = target.split("/", 1)[1] if target.startswith(f"{b}/") else target
        parts.append(f"[{r}]({b}/{r}/) ({word} {short})")
    return ", ".join(parts) or "-"


def index_text(root: Path = RESULTS) -> str:
    """``docs/results/index.md`` as the runs under ``root`` make it."""
    found = runs(root)
    lines = [
        "# Results index",
        "",
        "<!-- generated by `python benchmarks/results_index.py` from every run's run.json: do not edit -->",
        "",
        "Every run of a benchmark or recipe lives in `docs/results/<benchmark>/<run>/`: its `summary.json`,",
        "plots and `run.json` (`command`, `commit`, `date`, `machine`, `status`, sometimes a `note`).",
        "`commit` is the code the run names in its own files where it does, else the commit that last",
        "wrote the folder; a command rebuilt from the run's recorded arguments or its README says so in",
        "`note`, and one that nobody recorded reads \"not recorded\". Each benchmark has one **current**",
        "run (the one the docs quote); the others are *superseded* (an earlier run of the same question)",
        "or *variants* (another setting, bundle or scale, still quoted beside the current one). The",
        "headline is read from the current run's `summary.json`; figures on synthetic data are synthetic.",
        "The scripts and how to run them: [benchmarks/README.md](../../benchmarks/README.md).",
    ]
    for group in GROUPS:
        names = [b for b, e in BENCHMARKS.items() if e.group == group and b in found]
        if not names:
            continue
        lines += ["", f"## {group}", "",
                  "| benchmark | question | current run | headline | discussed in | other runs |",
                  "|---|---|---|---|---|---|"]
        for b in names:
            e, rs = BENCHMARKS[b], found[b]
            cur = _current(rs)
            summary = json.loads((root / b / cur / "summary.json").read_text())
            lines.append(f"| [{b}](../../{e.script}) | {_cell(e.question)} | [{cur}]({b}/{cur}/) | "
                         f"{_cell(e.headline(summary))} | [{e.docs}](../{e.docs}) | {_others(b, rs)} |")
    pending = [(b, e) for b, e in BENCHMARKS.items() if b not in found and e.pending]
    if pending:
        lines += ["", "## not run yet", "", "| benchmark | question | why no run yet | discussed in |", "|---|---|---|---|"]
        lines += [f"| [{b}](../../{e.script}) | {_cell(e.question)} | {_cell(e.pending)} | [{e.docs}](../{e.docs}) |"
                  for b, e in pending]
    return "\n".join(lines) + "\n"


def readme_table(root: Path = RESULTS) -> str:
    """The benchmarks' table of ``benchmarks/README.md``: script, question, docs page, results, command."""
    found = runs(root)
    lines = ["| script | question | docs | results | command of the current run |", "|---|---|---|---|---|"]
    for group in GROUPS[:-1]:
        for b, e in BENCHMARKS.items():
            if e.group != group:
                continue
            cur = _current(found[b]) if b in found else None
            command = found[b][cur]["command"] if cur else "-"
            results = f"[{b}/](../docs/results/{b}/)" if b in found else "-"
            lines.append(f"| [{e.script.removeprefix('benchmarks/')}]({e.script.removeprefix('benchmarks/')}) | "
                         f"{_cell(e.question)} | [{e.docs}](../docs/{e.docs}) | {results} | `{_cell(command)}` |")
    return "\n".join(lines) + "\n"


def readme_text(current: str, root: Path = RESULTS) -> str:
    """``current`` (benchmarks/README.md's text) with the generated table between its markers."""
    head, sep, rest = current.partition(README_BEGIN)
    _, sep2, tail = rest.partition(README_END)
    if not (sep and sep2):
        raise SystemExit(f"error: {README.relative_to(ROOT)} lacks the markers {README_BEGIN} ... {README_END}")
    return f"{head}{README_BEGIN}\n{readme_table(root)}{README_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything is wrong or stale")
    args = p.parse_args(argv)
    wrong = problems()
    if wrong:
        print("\n".join(f"error: {w}" for w in wrong), file=sys.stderr)
        return 1
    files = {INDEX: index_text(), README: readme_text(README.read_text())}
    stale = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"error: {path.relative_to(ROOT)} is stale: run python benchmarks/results_index.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(files[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
