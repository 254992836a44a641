"""examples/own_trainer.py, the "add nestflex to your own Trainer" example, runs at tiny settings."""

import nestflex.deploy as nd
from tests.scripts import load_script


def test_the_own_trainer_example_runs_end_to_end(tmp_path, capsys):
    result = load_script("examples/own_trainer.py").main(["--out", str(tmp_path), "--samples", "256", "--epochs", "1"])
    bundle = nd.load(result["bundle"])
    assert bundle.num_levels >= 2 and tuple(bundle.input_spec["shape"]) == (1, 28, 28)
    assert bundle.exits is not None and result["exits_backbone"] == "shared"
    printed = capsys.readouterr().out
    assert f"bundle: {result['bundle']}" in printed and "level 0:" in printed
