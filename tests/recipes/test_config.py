"""The recipes' options as one typed config (recipes/_config.py): every flag the argparse parsers
had before still parses to the same value, ``--config FILE`` works under the flags, and a bad
value stops with an error naming the flag, the value and the fix."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from tests.scripts import load_script

# the flags, defaults, types and choices of the hand-written parsers the configs replaced
BEFORE = json.loads((Path(__file__).parent / "flags_before_config.json").read_text())
RECIPES = sorted(BEFORE)


@pytest.fixture(scope="module", params=RECIPES)
def recipe(request):
    return load_script(f"recipes/{request.param}.py")


def _by_flag(config) -> dict:
    """``{flag: value}`` of a parsed config, through the same walk that generated the parser."""
    from _config import _get, _options

    return {o.flag: _get(config, o.path) for o in _options(type(config))}


def _sample(flag: str, spec: dict):
    """A non-default command-line value for ``flag`` and what it must parse to."""
    if "choices" in spec:
        return spec["choices"][-1], spec["choices"][-1]
    return {"int": ("7", 7), "float": ("0.5", 0.5), "str": ("x7", "x7")}[spec["type"]]


def test_every_flag_of_the_old_parser_parses_to_the_same_value(recipe):
    before = BEFORE[recipe.__name__]
    defaults = _by_flag(recipe.parse_args([]))
    assert set(before) <= set(defaults), f"flags lost: {set(before) - set(defaults)}"
    for flag, spec in before.items():
        assert defaults[flag] == spec["default"] and type(defaults[flag]) is type(spec["default"]), flag
        if spec["type"] == "bool":
            assert _by_flag(recipe.parse_args([flag]))[flag] is True
            continue
        if flag == "--stages":
            names = list(recipe.STAGES)
            argv, want = ",".join(names[::-1]), names[::-1]
            assert recipe.parse_args([flag, argv]).stage_list == want
            continue
        argv, want = _sample(flag, spec)
        got = _by_flag(recipe.parse_args([flag, argv]))[flag]
        assert got == want and type(got) is type(want), (flag, got, want)
    # the generated parser keeps each flag's type and choices (--data's list is nestflex.data's, which may grow)
    from _config import build_parser

    actions = {a.option_strings[0]: a for a in build_parser(type(recipe.parse_args([])))._actions if a.option_strings}
    for flag, spec in before.items():
        if spec["type"] in ("int", "float"):
            assert actions[flag].type.__name__ == spec["type"], flag
        if "choices" in spec:
            assert set(spec["choices"]) <= set(actions[flag].choices), flag


def test_the_stage_functions_are_the_config_s_stages(recipe):
    config = type(recipe.parse_args([]))
    assert tuple(recipe.STAGES) == tuple(recipe.parse_args([]).stage_list)
    assert tuple(recipe.STAGES) == tuple(config().stage_list)


def test_a_config_file_sets_options_and_flags_override_it(tmp_path, capsys):
    recipe = load_script("recipes/vgg_cifar.py")
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("model: vgg11\nwidth: 0.5\nseed: 3\ndevices: 2\n"
                         "data: {kind: synthetic, download: true, max_train_samples: 600}\n"
                         "prune: {max_drop: 2, round_to: '8'}\nexits: {mode: joint}\nflex: {train_samples: null}\n")
    cfg = recipe.parse_args(["--config", str(yaml_file), "--width", "0.125", "--prune-round-to", "16",
                             "--no-download"])
    assert (cfg.model, cfg.width, cfg.seed, cfg.devices) == ("vgg11", 0.125, 3, "2")  # the flag wins over the file
    assert (cfg.data.kind, cfg.data.download, cfg.data.max_train_samples) == ("synthetic", False, 600)
    assert (cfg.prune.max_drop, cfg.prune.round_to, cfg.exits.mode) == (2.0, 16, "joint")
    assert isinstance(cfg.prune.max_drop, float) and cfg.flex.train_samples is None
    assert cfg.epochs == 6 and cfg.grow.levels == 5  # left out of the file: the defaults

    # --print-config writes what --config reads: the round trip gives the same config (JSON too)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        recipe.parse_args(["--config", str(yaml_file), "--epochs", "2", "--print-config"])
    assert stop.value.code == 0
    json_file = tmp_path / "run.json"
    json_file.write_text(capsys.readouterr().out)
    again = recipe.parse_args(["--config", str(json_file)])
    assert again == dataclasses.replace(recipe.parse_args(["--config", str(yaml_file)]), epochs=2)

    # the file's values are the defaults --help shows
    with pytest.raises(SystemExit):
        recipe.parse_args(["--config", str(yaml_file), "--help"])
    assert "(default: vgg11)" in capsys.readouterr().out


def test_the_budget_mode_flag_is_none_by_default_and_parses_from_a_flag_or_a_file(tmp_path):
    recipe = load_script("recipes/vgg_cifar.py")
    assert recipe.parse_args([]).prune.target is None  # the accuracy-goal mode (NestDNN's)
    assert recipe.parse_args(["--prune-target", "0.3"]).prune.target == 0.3
    path = tmp_path / "budget.yaml"
    path.write_text("prune: {target: 0.25}\n")
    assert recipe.parse_args(["--config", str(path)]).prune.target == 0.25
    assert recipe.parse_args(["--config", str(path), "--prune-target", "0.5"]).prune.target == 0.5


def test_the_time_budget_flag_is_none_by_default_and_parses_with_the_latency_cost(tmp_path):
    recipe = load_script("recipes/vgg_cifar.py")
    assert recipe.parse_args([]).prune.target_cost is None
    assert recipe.parse_args(["--prune-cost", "latency", "--prune-target-cost", "0.5"]).prune.target_cost == 0.5
    path = tmp_path / "time.yaml"
    path.write_text("prune: {cost: latency, target_cost: 0.25}\n")
    assert recipe.parse_args(["--config", str(path)]).prune.target_cost == 0.25


def test_progressive_recipe_reads_a_config_file(tmp_path):
    recipe = load_script("recipes/progressive_cifar.py")
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"epochs": 2, "data": {"max_train_samples": 0}, "exits": {"head": "msdnet"}}))
    cfg = recipe.parse_args(["--config", str(path), "--fallback", "final"])
    assert (cfg.epochs, cfg.data.max_train_samples, cfg.exits.head, cfg.exits.fallback) == (2, 0, "msdnet", "final")


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["--precision-budget", "-0.5"], "--precision-budget must be >= 0 accuracy points, got -0.5"),
    (["--prune-max-drop", "100"], r"--prune-max-drop is in accuracy points, in \[0, 100\), got 100.0"),
    (["--prune-retry-budget", "-2"], r"--prune-retry-budget is a count of tries \(-1: no bound\), got -2"),
    (["--prune-target", "1"], r"--prune-target is a share of the baseline's MACs in \(0, 1\), got 1.0. HINT: 0.3 "
                              r"keeps 30% of the MACs; leave it out for the accuracy-goal mode"),
    (["--prune-target", "0"], r"--prune-target is a share of the baseline's MACs in \(0, 1\), got 0.0"),
    (["--prune-target", "a third"], "argument --prune-target: invalid float value: 'a third'"),
    (["--prune-target-cost", "0.5"], r"--prune-target-cost 0.5 is a share of the time the latency table predicts, "
                                     r"got --prune-cost macs. HINT: add --prune-cost latency"),
    (["--prune-cost", "latency", "--prune-target-cost", "1"], r"--prune-target-cost is a share of the baseline's "
                                                              r"predicted time in \(0, 1\), got 1.0. HINT: 0.5 keeps "
                                                              r"half the time"),
    (["--prune-cost", "latency", "--prune-target", "0.3", "--prune-target-cost", "0.5"],
     r"--prune-target and --prune-target-cost are two budgets, got 0.3 and 0.5. HINT: pass one"),
    (["--prune-decision", "paired", "--prune-target", "0.3"], r"--prune-decision paired judges steps against the "
                                                               r"accuracy goal, got --prune-target 0.3 .*HINT: leave "
                                                               r"--prune-target out"),
    (["--prune-decision", "bound"], r"argument --prune-decision: invalid choice: 'bound'"),
    (["--prune-confidence", "1"], r"--prune-confidence is a confidence in \(0.5, 1\), got 1.0. HINT: 0.9"),
    (["--prune-confidence", "0.5"], r"--prune-confidence is a confidence in \(0.5, 1\), got 0.5. HINT: 0.9"),
    (["--prune-confirm", "0.5"], r"--prune-confirm is a confidence in \(0.5, 1\), got 0.5. HINT: 0.9"),
    (["--prune-confirm", "0.9", "--prune-target", "0.3"], r"--prune-confirm 0.9 checks the seed against the accuracy "
                                                           r"goal, got --prune-target 0.3 .*HINT: leave --prune-target out"),
    (["--grow-levels", "1"], "--grow-levels must be >= 2, got 1"),
    (["--flex-train-samples", "0"], "--flex-train-samples must be >= 1, got 0. HINT: leave it out for all"),
    (["--flex-calibration-samples", "3"], r"--flex-calibration-samples must be 0 \(thresholds on the planning "
                                          r"images\) or >= 5 \(the cross-validation folds\), got 3"),
    (["--flex-rate-tolerance", "1"], r"--flex-rate-tolerance is a share of samples in \[0, 1\), got 1.0"),
    (["--width", "0"], "--width must be > 0, got 0.0"),
    (["--stages", "baseline,nope"], r"--stages has unknown stage\(s\) \['nope'\]; choose from baseline, prune, "
                                    r"grow, exits, flex, profile, export or all, got 'baseline,nope'"),
    (["--stages", ","], r"--stages has unknown stage\(s\) \[','\]"),
    (["--exit-mode", "both"], r"argument --exit-mode: invalid choice: 'both' \(choose from 'exits_only', 'joint'\)"),
    (["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
])
def test_a_bad_flag_names_the_flag_the_value_and_the_fix(argv, message, capsys):
    recipe = load_script("recipes/vgg_cifar.py")
    with pytest.raises(SystemExit) as stop:
        recipe.parse_args(argv)
    assert stop.value.code == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("text, message", [
    ("prune: {max_dorp: 2}", r"unknown option `prune.max_dorp`. HINT: known options are model, width, "
                             r".*prune.max_drop"),
    ("epoch: 2", r"unknown option `epoch`"),
    ("prune: {max_steps: two}", r"`prune.max_steps` \(--prune-max-steps\) must be of type int, got 'two'. "
                                r"HINT: its default is 10"),
    ("download: true", r"unknown option `download`"),  # a group's option, not a top-level one
    ("data: {download: 'yes'}", r"`data.download` \(--download\) must be of type bool, got 'yes'"),
    ("exits: {epochs: 0}", "--exit-epochs must be >= 1, got 0"),  # checked like the flag
    ("data: {kind: imagenet}", r"--data must be one of auto, cifar10, .*, got 'imagenet'"),
    ("- a list", "expected a mapping of options, got list"),
    ("model: [unclosed", "cannot read it"),
])
def test_a_bad_config_file_names_the_option_and_the_fix(text, message, tmp_path, capsys):
    recipe = load_script("recipes/vgg_cifar.py")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as stop:
        recipe.parse_args(["--config", str(path)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_a_missing_config_file_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_script("recipes/vgg_cifar.py").parse_args(["--config", str(tmp_path / "nowhere.yaml")])
    assert f"--config {tmp_path / 'nowhere.yaml'}: cannot read it" in capsys.readouterr().err


def test_a_config_built_in_python_is_checked_too():
    recipe = load_script("recipes/vgg_cifar.py")
    from _config import ConfigError

    from nestflex import NestflexError

    cfg = recipe.parse_args([])
    with pytest.raises(ConfigError, match="--prune-round-to must be >= 1, got 0"):
        dataclasses.replace(cfg, prune=dataclasses.replace(cfg.prune, round_to=0))
    with pytest.raises(NestflexError, match="--exit-fallback must be one of most_confident, final, got 'first'"):
        dataclasses.replace(cfg, exits=dataclasses.replace(cfg.exits, fallback="first"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epochs = 3
