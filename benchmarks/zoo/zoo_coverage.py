"""The structure graph over model zoos: which models trace, prune and stay correct (issue 21).

For each model (random weights, one process per model so a crash or a hang costs one row):
build it, ``trace`` it at ``--size`` x ``--size``, count its groups and split points, compare
its MACs with ``torch.utils.flop_counter`` (FLOPs / 2 of convolutions and matrix products),
prune ``--ratio`` of every prunable group (random channels), and check

- **pruned = masked**: in float64, the pruned model's output equals the unpruned model's with
  every consumer of a dropped channel ignoring it (its input rows zeroed, at their offset in a
  concatenation), within 1e-8 of the output's scale;
- **MACs as predicted**: a re-trace of the pruned model has exactly the MACs ``graph.macs``
  predicted from the widths.

    python benchmarks/zoo/zoo_coverage.py --zoo torchvision --out runs/zoo_torchvision
    python benchmarks/zoo/zoo_coverage.py --zoo torchvision --models densenet121,googlenet --out /tmp/z

With ``--torch-pruning`` (``pip install torch-pruning==1.6.1``; not a nestflex dependency) each
model is also pruned by Torch-Pruning's ``MetaPruner`` in its own process, with the settings of
its benchmarks: magnitude (L2) group importance, ``pruning_ratio`` = ``--ratio`` on every layer,
the classifier ignored, attention heads declared (``num_heads``), and passes when the pruned
model still runs and gives logits of the same shape. Its MACs are counted by the same flop counter.

``--jobs N`` checks N models at once (each child gets ``--threads``, default ``cores // N``, torch
threads); every
finished row is appended to ``rows.jsonl`` in ``--out`` at once, and ``--resume`` skips the models
already there, so a run cut short loses nothing.

For timm models the row also says whether ``nestflex.models.create_timm_model`` gives it a CIFAR
stem (32x32 inputs) by its general rule (``cifar_stem``: true, or the error).

Writes ``summary.json`` (one row per model, the counts, the medians of MACs left over the models
both tools prune when Torch-Pruning ran, and the issue's ``goals``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository root, for benchmarks.*
from benchmarks._common import add_out_args, resolve_out, write_run  # noqa: E402

#: a broad timm list: CNNs, mobile nets, hybrids and transformers (the issue asks for >= 50)
TIMM_MODELS = [
    "resnet18", "resnet50", "resnext50_32x4d", "seresnet50", "wide_resnet50_2", "densenet121", "dpn68",
    "inception_v3", "inception_v4", "xception41", "vgg11_bn", "regnetx_002", "regnety_002", "mobilenetv2_100",
    "mobilenetv3_small_100", "mobilenetv3_large_100", "efficientnet_b0", "efficientnet_lite0", "mnasnet_100",
    "ghostnet_100", "hrnet_w18_small", "res2net50_14w_8s", "skresnet18",
    "cspdarknet53", "cspresnet50", "darknet53", "dla34", "rexnet_100", "tinynet_a", "lcnet_050", "fbnetc_100",
    "hardcorenas_a", "nf_resnet26", "resnetv2_50", "convnext_atto", "convnextv2_atto", "edgenext_xx_small",
    "poolformer_s12", "mobilevit_xxs", "mobilevitv2_050", "levit_128s", "efficientformer_l1",
    "efficientformerv2_s0", "vit_tiny_patch16_224", "deit_tiny_patch16_224", "swin_tiny_patch4_window7_224",
    "maxvit_nano_rw_256", "coat_lite_tiny", "mixer_b16_224", "resmlp_12_224", "gmlp_ti16_224", "pit_ti_224",
    "tnt_s_patch16_224", "crossvit_tiny_240", "repvgg_a0",
]


#: models whose stem needs a larger input than the default size
MIN_SIZE = {"inception_v3": 96, "inception_v4": 96, "maxvit_t": 224,  # MaxViT: 7x7 windows in every stage
            "vit_h_14": 70}  # its 14x14 patches must tile the input


def build(zoo: str, name: str, size: int):
    size = max(size, MIN_SIZE.get(name, 0))
    if zoo == "torchvision":
        import torchvision

        kwargs: dict[str, Any] = {}
        if name in ("googlenet", "inception_v3"):
            kwargs = {"aux_logits": False, "init_weights": True}
        if name.startswith("vit_"):
            kwargs["image_size"] = size
        if name.startswith("maxvit"):
            kwargs["input_size"] = (size, size)
        return torchvision.models.get_model(name, weights=None, **kwargs).eval(), (3, size, size)
    import timm

    model = timm.create_model(name, pretrained=False, num_classes=10)
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    fixed = cfg.get("fixed_input_size", False) or name.startswith(("vit_", "deit_", "swin_", "maxvit", "mixer",
                                                                     "resmlp", "gmlp", "pit_", "tnt_", "crossvit",
                                                                     "levit", "efficientformer", "coat"))
    shape = tuple(cfg.get("input_size", (3, 224, 224))) if fixed else (3, size, size)
    return model.eval(), shape


def check_one(zoo: str, name: str, size: int, ratio: float) -> dict[str, Any]:
    """Every step for one model; the row says how far it got and what failed."""
    import torch

    from nestflex.graph import prune_channels, trace

    torch.manual_seed(0)
    row: dict[str, Any] = {"model": name, "step": "build"}
    if zoo == "timm":
        row["cifar_stem"] = cifar_stem(name)
    model, shape = build(zoo, name, size)
    row["input_shape"] = list(shape)
    x = torch.randn(2, *shape)
    row["step"] = "trace"
    graph = trace(model, shape)
    row.update(groups=len(graph.groups), prunable=len(graph.prunable_groups), split_points=len(graph.split_points),
               macs=graph.macs(), unsupported=sorted(set(graph.unsupported))[:8])
    row["macs_vs_flop_counter"] = round(graph.macs() / max(1, _flop_macs(model, x[:1])), 4)
    if not graph.prunable_groups:
        row.update(step="done", pruned=False, macs_left=1.0)
        return row
    row["step"] = "prune"
    keep = {g.id: torch.randperm(g.width)[: max(1, round(g.width * (1 - ratio)))] for g in graph.prunable_groups}
    predicted = graph.macs({gid: len(k) for gid, k in keep.items()})
    model, x = model.double(), x.double()
    with torch.no_grad():
        for g in graph.prunable_groups:  # consumers ignore the channels about to go
            drop = torch.ones(g.width, dtype=torch.bool)
            drop[keep[g.id]] = False
            drop = drop.nonzero().flatten()
            for m in g.members:
                if m.role == "in" and drop.numel():
                    getattr(model.get_submodule(m.module), m.attr).index_fill_(m.dim, m.rows(g, drop, others=False), 0)
        masked = model(x)
        for g in graph.prunable_groups:
            prune_channels(model, g, keep[g.id])
        pruned = model(x)
    scale = max(1.0, masked.abs().max().item())
    row["max_abs_diff"] = (pruned - masked).abs().max().item()
    row["pruned_equals_masked"] = row["max_abs_diff"] <= 1e-8 * scale
    row["step"] = "retrace"
    again = trace(model.float(), shape)
    row.update(macs_as_predicted=again.macs() == predicted, macs_left=round(predicted / graph.macs(), 4),
               pruned=True, step="done")
    return row


def cifar_stem(name: str) -> bool | str:
    """True when ``create_timm_model`` adapts the model to 32x32 inputs (its CIFAR stem rule) and
    it then runs on one; else the error."""
    import torch

    from nestflex.models.timm_adapter import create_timm_model

    try:
        model = create_timm_model(name).eval()
        with torch.no_grad():
            out = model(torch.zeros(1, 3, 32, 32))
        return True if out.shape == (1, 10) else f"logits of shape {tuple(out.shape)}"
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


def _flop_macs(model, x) -> int:
    """MACs of one forward by torch.utils.flop_counter (FLOPs / 2), with torch's attention formula
    registered for the CPU kernel of fused attention (``nestflex.graph.flop_counter``: torch counts
    only the CUDA kernels); nn.MultiheadAttention's inference fast path is one fused op the
    counter does not see, so it is off."""
    import torch

    from nestflex.graph import flop_counter

    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with flop_counter(model) as counter, torch.no_grad():
            model(x)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return counter.get_total_flops() // 2


def check_torch_pruning(zoo: str, name: str, size: int, ratio: float) -> dict[str, Any]:
    """Torch-Pruning's MetaPruner on the same model and input (see the module docstring)."""
    import torch
    import torch_pruning as tp

    torch.manual_seed(0)
    model, shape = build(zoo, name, size)
    x = torch.randn(1, *shape)
    with torch.no_grad():
        ref = model(x)
    base = _flop_macs(model, x)
    classes = ref.shape[-1]
    heads = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
             and getattr(m, "out_features", getattr(m, "out_channels", None)) == classes]
    num_heads = {}
    for m in model.modules():
        if isinstance(m, torch.nn.MultiheadAttention):
            num_heads[m] = m.num_heads
        elif isinstance(getattr(m, "qkv", None), torch.nn.Linear) and isinstance(getattr(m, "num_heads", None), int):
            num_heads[m.qkv] = m.num_heads  # timm attention blocks, as Torch-Pruning's timm benchmark does
    imp_cls = getattr(tp.importance, "GroupMagnitudeImportance", None) or tp.importance.MagnitudeImportance
    pruner = tp.pruner.MetaPruner(model, x, importance=imp_cls(p=2), pruning_ratio=ratio, ignored_layers=heads[-1:],
                                  num_heads=num_heads)
    pruner.step()
    for m in model.modules():  # what Torch-Pruning's ViT examples do after a step: the heads' sizes follow
        qkv = getattr(m, "qkv", None)
        if qkv in num_heads and isinstance(getattr(m, "head_dim", None), int):
            m.num_heads = pruner.num_heads.get(qkv, m.num_heads)
            m.head_dim = qkv.out_features // (3 * m.num_heads)
            if isinstance(getattr(m, "attn_dim", None), int):
                m.attn_dim = m.num_heads * m.head_dim
    with torch.no_grad():
        out = model(x)
    if out.shape != ref.shape:
        raise RuntimeError(f"pruned output shape {tuple(out.shape)} != {tuple(ref.shape)}")
    return {"model": name, "tp_macs_left": round(_flop_macs(model, x) / base, 4)}


#: the issue's goals: models passing every step per zoo, and how close the MACs must be
GOAL_PASSED = {"torchvision": 76 / 80, "timm": 50 / 55}
GOAL_MEDIAN_GAP = 0.05
GOAL_MACS_TOLERANCE = 0.01
#: a model pruned to more than this share of its MACs passes, and its goal note names it
BARELY_PRUNED = 0.99


def run_child(zoo: str, name: str, size: int, ratio: float, timeout: float, tool: str = "nestflex",
              threads: int | None = None) -> dict[str, Any]:
    flag = "--one" if tool == "nestflex" else "--one-tp"
    cmd = [sys.executable, __file__, flag, name, "--zoo", zoo, "--size", str(size), "--ratio", str(ratio)]
    env = dict(os.environ)
    if threads:  # torch reads these at start; N children at once share the cores
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"model": name, "ok": False, "error": f"timed out after {timeout:.0f} s", "seconds": round(timeout, 1)}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    row = json.loads(lines[-1]) if lines else {"model": name, "ok": False,
                                                "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zoo", choices=["torchvision", "timm"], default="torchvision")
    p.add_argument("--models", default=None, help="comma list (default: every torchvision classification model, "
                                                   "or the timm list in this file)")
    p.add_argument("--size", type=int, default=64, help="input height and width (fixed-size models use their own)")
    p.add_argument("--ratio", type=float, default=0.3, help="share of every prunable group to remove")
    p.add_argument("--timeout", type=float, default=600, help="seconds per model")
    add_out_args(p, "summary.json, rows.jsonl, table.md and run.json")
    p.add_argument("--jobs", type=int, default=1, help="models checked at once (default 1)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per model (default: cores // jobs)")
    p.add_argument("--resume", action="store_true", help="keep the rows already in OUT/rows.jsonl, check the rest")
    p.add_argument("--torch-pruning", action="store_true",
                   help="also prune each model with Torch-Pruning (pip install torch-pruning==1.6.1)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--one-tp", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not 0 < a.ratio < 1:
        p.error(f"--ratio is a share in (0, 1), got {a.ratio}")
    if a.jobs < 1:
        p.error(f"--jobs is a count of models checked at once, at least 1, got {a.jobs}")
    if a.one:
        try:
            row = {**check_one(a.zoo, a.one, a.size, a.ratio), "ok": True}
        except Exception as e:  # the row records the failure; the parent goes on with the next model
            row = {"model": a.one, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        ok = row.get("step") == "done" and row.get("pruned_equals_masked", True) and row.get("macs_as_predicted", True)
        row["ok"] = bool(row["ok"] and ok)
        print(json.dumps(row))
        return row
    if a.one_tp:
        try:
            row = {**check_torch_pruning(a.zoo, a.one_tp, a.size, a.ratio), "ok": True}
        except Exception as e:
            row = {"model": a.one_tp, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(json.dumps(row))
        return row
    resolve_out(a, __file__)
    if a.torch_pruning:
        try:
            import torch_pruning  # noqa: F401
        except ImportError:
            p.error("--torch-pruning needs Torch-Pruning: pip install torch-pruning==1.6.1")
    if a.models:
        models = [m for m in a.models.split(",") if m]
    elif a.zoo == "torchvision":
        import torchvision

        models = torchvision.models.list_models(module=torchvision.models)
    else:
        models = TIMM_MODELS
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "rows.jsonl"
    done: dict[str, dict[str, Any]] = {}
    if a.resume and log.exists():
        for line in log.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill: that model runs again
                continue
            if row.get("model") in models and (row.get("tp_ok") is not None or not a.torch_pruning):
                done[row["model"]] = row
    elif log.exists():
        log.unlink()
    threads = a.threads or (max(1, (os.cpu_count() or 1) // a.jobs) if a.jobs > 1 else None)
    lock = threading.Lock()

    def one(name: str) -> dict[str, Any]:
        r = run_child(a.zoo, name, a.size, a.ratio, a.timeout, threads=threads)
        if a.torch_pruning:
            t = run_child(a.zoo, name, a.size, a.ratio, a.timeout, tool="torch_pruning", threads=threads)
            r.update(tp_ok=t["ok"], tp_macs_left=t.get("tp_macs_left"), tp_error=t.get("error"), tp_seconds=t["seconds"])
        with lock:
            with log.open("a") as f:
                f.write(json.dumps(r) + "\n")
            print(f"{name:32s} {'ok ' if r['ok'] else 'FAIL'} prunable {r.get('prunable', '-')}/{r.get('groups', '-')} "
                  f"macs left {r.get('macs_left', '-')} macs/ref {r.get('macs_vs_flop_counter', '-')} "
                  f"{'tp ' + ('ok' if r['tp_ok'] else 'FAIL') + ' ' + str(r['tp_macs_left']) if a.torch_pruning else ''} "
                  f"{r.get('error', '')}", flush=True)
        return r

    todo = [m for m in models if m not in done]
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for r in pool.map(one, todo):
            done[r["model"]] = r
    rows = [done[m] for m in models]
    from nestflex._io import write_json
    from nestflex._machine import machine

    pruned = [r for r in rows if r["ok"] and r.get("pruned")]
    exact = [r for r in rows if r.get("macs_vs_flop_counter") is not None and abs(r["macs_vs_flop_counter"] - 1) <= 0.01]
    summary = {
        "benchmark": "zoo_coverage", "zoo": a.zoo, "size": a.size, "ratio": a.ratio, "machine": machine(),
        "models": len(rows), "passed": sum(r["ok"] for r in rows), "pruned": len(pruned),
        "median_macs_left": statistics.median(r["macs_left"] for r in pruned) if pruned else None,
        "macs_within_1pct_of_flop_counter": len(exact), "rows": rows,
    }
    if a.zoo == "timm":
        summary["cifar_stem"] = sum(r.get("cifar_stem") is True for r in rows)
    if a.torch_pruning:
        both = [r for r in pruned if r.get("tp_ok")]
        summary["torch_pruning"] = {
            "version": _version("torch_pruning"), "passed": sum(bool(r.get("tp_ok")) for r in rows),
            "median_macs_left": statistics.median(r["tp_macs_left"] for r in rows if r.get("tp_ok"))
            if any(r.get("tp_ok") for r in rows) else None,
            "both": len(both),
            "median_macs_left_both": {"nestflex": statistics.median(r["macs_left"] for r in both),
                                      "torch_pruning": statistics.median(r["tp_macs_left"] for r in both)}
            if both else None,
        }
    summary["goals"] = goals(summary, rows, a.zoo)
    write_json(a.out / "summary.json", summary)
    write_table(summary, a.out / "table.md")
    write_run(a.out, __file__, argv)
    print(f"passed {summary['passed']}/{len(rows)}, pruned {len(pruned)}, median MACs left "
          f"{summary['median_macs_left']}, MACs within 1% of the flop counter on {len(exact)}")
    return summary


def goals(summary: dict[str, Any], rows: list[dict[str, Any]], zoo: str) -> dict[str, Any]:
    """The issue's acceptance, one entry per goal (DESIGN.md's result contract)."""
    n = len(rows)
    need = round(GOAL_PASSED[zoo] * n) if n else 0
    # A model with no prunable group traces and checks, but no pruning step ran on it, so it does not
    # pass "every step" (issue 42): the count is the models pruned and checked, summary["pruned"].
    unpruned = [r["model"] for r in rows if r["ok"] and not r.get("pruned")]
    barely = [f"{r['model']} ({r['macs_left']} of the MACs left)" for r in rows
              if r["ok"] and r.get("pruned") and r["macs_left"] > BARELY_PRUNED]
    note = [f"traced and checked, nothing prunable, not counted: {', '.join(unpruned)}"] if unpruned else []
    note += [f"counted, barely pruned: {', '.join(barely)}"] if barely else []
    out: dict[str, Any] = {"passed": {
        "target": f">= {need}/{n} models pass every step, pruning included ({GOAL_PASSED[zoo]:.0%} of the list, "
                  "the issue's share)",
        "measured": summary["pruned"], "met": summary["pruned"] >= need, "note": "; ".join(note)}}
    tp = summary.get("torch_pruning")
    if tp:
        # like with like: models each tool pruned (MACs left below 1) and that passed its own check
        tp_pruned = sum(bool(r.get("tp_ok")) and r.get("tp_macs_left") is not None and r["tp_macs_left"] < 1
                        for r in rows)
        out["above_torch_pruning"] = {
            "target": "more models pruned and passing than Torch-Pruning prunes in the same harness",
            "measured": {"nestflex": summary["pruned"], "torch_pruning": tp_pruned},
            "met": summary["pruned"] > tp_pruned,
            "note": "Torch-Pruning passes when its pruned model runs with logits of the same shape; nestflex's "
                    "check is stricter (pruned = masked, MACs as predicted)"}
        both = tp["median_macs_left_both"]
        if both:
            gap = both["nestflex"] - both["torch_pruning"]
            out["median_macs_left"] = {
                "target": f"median MACs left within {GOAL_MEDIAN_GAP} of Torch-Pruning's on the {tp['both']} models "
                          "both prune", "measured": {**both, "gap": round(gap, 4)}, "met": gap <= GOAL_MEDIAN_GAP,
                "note": "a gap below 0 means nestflex removes more"}
    counted = [r for r in rows if r.get("macs_vs_flop_counter") is not None]
    off = [r["model"] for r in counted if abs(r["macs_vs_flop_counter"] - 1) > GOAL_MACS_TOLERANCE]
    out["macs_exact"] = {"target": f"MACs within {GOAL_MACS_TOLERANCE:.0%} of torch.utils.flop_counter on every "
                                   "model that traces", "measured": f"{len(counted) - len(off)}/{len(counted)}",
                         "met": not off and bool(counted), "note": f"off: {off}" if off else ""}
    return out


def write_table(summary: dict[str, Any], path: Path) -> None:
    """The per-model table in Markdown, one row per model of ``summary``."""
    tp = "torch_pruning" in summary
    head = ["model", "passes", "prunable / groups", "MACs left", "MACs / flop counter"]
    head += ["Torch-Pruning MACs left"] if tp else []
    head += ["CIFAR stem"] if summary["zoo"] == "timm" else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in summary["rows"]:
        if not r["ok"]:
            passes = f"no: {(r.get('error') or '')[:90]}"
        else:  # a model with nothing prunable was never pruned, so it does not pass the prune step
            passes = "yes" if r.get("pruned") else "no: traced and checked, nothing prunable"
        cells = [f"`{r['model']}`", passes,
                 f"{r.get('prunable', '-')} / {r.get('groups', '-')}", str(r.get("macs_left", "-")),
                 str(r.get("macs_vs_flop_counter", "-"))]
        if tp:
            cells.append(str(r["tp_macs_left"]) if r.get("tp_ok") else f"fails: {(r.get('tp_error') or '')[:60]}")
        if summary["zoo"] == "timm":
            cells.append("yes" if r.get("cifar_stem") is True else "no")
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package.replace("_", "-"))
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
