"""The FlexDNN network rebuilt from the files FlexDNNExits writes: one call, plain or grown network
(issue 39), on a user's own 1x16x16 CNN."""

import pytest
import torch

from nestflex.callbacks import FilterPruning, FlexDNNExits, FreezeAndGrow
from nestflex.capacity import is_nested, num_levels
from nestflex.errors import NestflexError
from nestflex.exits import load_flex_network as exported
from nestflex.exits.flexdnn import build_flex_network, load_flex_network
from nestflex.exits.flexdnn.spec import SPEC_FILE, WEIGHTS_FILE
from nestflex._io import read_json
from tests.exits.user_cnn import SHAPE, DigitsCNN, DigitsModule, loaders, trainer

FLEX = {"locations": [0.3, 0.6], "exits_per_location": 2, "epochs": 1, "rank_samples": 64, "fit_samples": 64,
        "refit_iters": 20}


def _same_outputs(a, b, x) -> None:
    with torch.no_grad():
        got, want = a.eval()(x), b.eval()(x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_a_grown_networks_exits_rebuild_from_the_files(tmp_path):
    """Prune, then grow the levels with FlexDNN exits planned at the end of the same fit; in a new
    process the user has the grown network and the folder: one call gives the callback's network."""
    torch.manual_seed(0)
    train, val = loaders()
    x = next(iter(val))[0][:8]
    trainer(tmp_path, [FilterPruning("l1", goal=0.01, step=0.3, allocation="uniform", max_steps=2)],
            max_epochs=2).fit(DigitsModule(), train, val)
    grown = DigitsModule()
    flex = FlexDNNExits(config=FLEX, calibration_fraction=0.5)
    trainer(tmp_path, [FreezeAndGrow(tmp_path / "pruning" / "roadmap.json", levels=2), flex], max_epochs=2).fit(
        grown, train, val)
    net = grown.model.cpu().eval()
    assert is_nested(net) and num_levels(net) == 2 and flex.result.network is not None
    before = {k: v.clone() for k, v in net.state_dict().items()}

    rebuilt = load_flex_network(net, tmp_path / "flexdnn")
    _same_outputs(rebuilt, flex.result.network, x)
    assert rebuilt.exit_names == flex.result.network.exit_names
    # the user's network is only read: a plain copy of its largest level carries the exits
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items()) and not is_nested(rebuilt.backbone)
    # the two-step path the docs showed before works on a grown network too
    spec = read_json(tmp_path / "flexdnn" / SPEC_FILE)
    twostep = build_flex_network(net, spec)
    from safetensors.torch import load_file

    twostep.load_state_dict(load_file(tmp_path / "flexdnn" / WEIGHTS_FILE))
    _same_outputs(twostep, flex.result.network, x)
    assert exported is load_flex_network  # nestflex.exits exports it too


def test_a_plain_networks_exits_rebuild_and_a_wrong_backbone_is_refused(tmp_path):
    torch.manual_seed(0)
    train, val = loaders()
    module = DigitsModule()
    flex = FlexDNNExits(dirpath=tmp_path / "out", config=FLEX, calibration_fraction=0.5)
    trainer(tmp_path, [flex], max_epochs=2).fit(module, train, val)
    assert flex.result.network is not None
    rebuilt = load_flex_network(module.model, tmp_path / "out")
    _same_outputs(rebuilt, flex.result.network, next(iter(val))[0][:8])
    assert rebuilt.backbone is not module.model  # copied: loading never writes into the user's module

    class Wider(DigitsCNN):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(24, 10, bias=False)

    with pytest.raises(NestflexError, match=r"`dirpath`=.*out': model\.safetensors does not fit the network built on "
                                            r"`backbone` \(Wider\): .*HINT: pass the network the exits were planned on"):
        load_flex_network(Wider(), tmp_path / "out")
    with pytest.raises(NestflexError, match=r"`dirpath`=.*nowhere' has no spec\.json\. HINT: pass FlexDNNExits' "
                                            r"output directory"):
        load_flex_network(module.model, tmp_path / "nowhere")
    (tmp_path / "out" / WEIGHTS_FILE).unlink()
    with pytest.raises(NestflexError, match=r"has spec\.json but no model\.safetensors\. HINT: the run that wrote "
                                            r"them was interrupted"):
        load_flex_network(module.model, tmp_path / "out")
    spec = read_json(tmp_path / "out" / SPEC_FILE)
    with pytest.raises(NestflexError, match=r"the FlexDNN spec lacks input_shape, exits\[\]\.widths\. HINT"):
        build_flex_network(module.model, {**{k: v for k, v in spec.items() if k != "input_shape"},
                                          "exits": [{k: v for k, v in e.items() if k != "widths"}
                                                    for e in spec["exits"]]})
    with pytest.raises(NestflexError, match=r"the FlexDNN spec has no exits \(the plan kept none\)\. HINT: use the "
                                            r"backbone alone"):
        build_flex_network(module.model, {**spec, "exits": []})
    assert tuple(spec["input_shape"]) == SHAPE
