"""FlexDNN moved into ``nestflex.exits.flexdnn`` (issue 39): the imports users wrote still work,
and ``import nestflex.exits`` still costs torch, not Lightning."""

import importlib
import subprocess
import sys

import pytest

import nestflex.exits as exits

# `import nestflex.exits.flexdnn as flex` would bind the function: the attribute `flexdnn` of
# nestflex.exits is the function, as it was before the subpackage (see its docstring)
flex = importlib.import_module("nestflex.exits.flexdnn")

#: ``nestflex.exits.__all__`` before the move: every name must still import from there
BEFORE = [
    "ExitError", "MultiExitNetwork", "DEFAULT_POSITIONS", "resolve_positions", "register_head", "list_heads",
    "get_head", "create_head", "tau_schedule", "loss_weights", "multi_exit_loss", "WEIGHTINGS",
    "register_confidence", "list_confidences", "get_confidence", "check_thresholds", "decide", "apply_policy",
    "early_exit", "ExitResult", "FALLBACKS", "DEFAULT_THRESHOLDS", "collect_logits", "evaluate_thresholds",
    "lossless_thresholds", "exit_profile", "calibrate", "FilterSubsetExit", "RankedDropout", "CompactHead",
    "exit_filter_counts", "fine_grained_exit", "InsertionPlan", "insertion_plan", "subset_cost", "FlexDNNConfig",
    "FlexDNNResult", "flexdnn", "evaluate_flex", "build_flex_network", "operating_points", "threshold_front",
    "MultiExitClassifier", "MODES", "OverthinkingSchedule", "FlexDNNExits",
]


@pytest.mark.parametrize("name", BEFORE)
def test_every_name_exported_before_still_imports(name):
    assert name in exits.__all__
    assert getattr(exits, name) is not None


def test_flexdnn_names_are_one_object_under_both_paths():
    for name in flex.__all__:
        assert getattr(exits, name) is getattr(flex, name), name
    from nestflex.callbacks import FlexDNNExits

    assert FlexDNNExits is flex.FlexDNNExits is exits.FlexDNNExits
    assert callable(exits.flexdnn) and exits.flexdnn is flex.flexdnn  # the attribute stays the function


@pytest.mark.parametrize("old,new", [("fine_grained", "fine_grained"), ("search", "search"), ("plan", "plan")])
def test_the_moved_modules_import_by_their_old_paths(old, new):
    module = importlib.import_module(f"nestflex.exits.flexdnn.{new}")
    assert importlib.import_module(f"nestflex.exits.{old}") is module
    assert getattr(exits, old) is module  # `import nestflex.exits.search; nestflex.exits.search.X`


def test_the_old_flexdnn_module_path_is_the_subpackage_with_its_names():
    from nestflex.exits.flexdnn import (  # noqa: F401  the names the old module exported
        FlexDNNConfig, FlexDNNResult, build_flex_network, evaluate_flex, flexdnn, operating_points,
    )
    from nestflex.exits.search import Candidate, train_candidates  # noqa: F401  benchmarks/exits/flex_plan.py

    assert importlib.import_module("nestflex.exits.flexdnn") is flex


def test_importing_the_exits_loads_no_lightning():
    code = ("import sys, nestflex.exits, nestflex.exits.flexdnn; "
            "print(sorted(m for m in ('pytorch_lightning', 'lightning', 'torchmetrics') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
