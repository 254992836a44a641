"""The manifest schema: one typed definition read and written; every field the runtime uses checked.

These tests edit the manifest of the committed schema-1 fixture (upgraded to schema 2) in memory,
so they build no model.
"""

import copy
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from nestflex.deploy.backends import torch_program as runtime
from nestflex.deploy.bundle._reading import _show
from nestflex.deploy.bundle.capacity_records import LevelRow
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.exit_records import ExitPlan, ExitSet, OperatingPoint
from nestflex.deploy.bundle.file_records import TensorInfo
from nestflex.deploy.bundle.manifest import Manifest
from nestflex.deploy.bundle.program_records import PROGRAM_OPS, Program
from nestflex.deploy.bundle.quantization_records import QuantizationRow, SplitQuantization
from nestflex.deploy.bundle.safetensors_header import read_safetensors_header

FIXTURE = Path(__file__).parent / "fixtures" / "bundle_v1.nfx"
CONV1 = "backbone.features.conv1.weight"


@pytest.fixture(scope="module")
def raw_v1():
    return json.loads((FIXTURE / "manifest.json").read_text())


@pytest.fixture(scope="module")
def header():
    return read_safetensors_header(FIXTURE / "weights.safetensors")


@pytest.fixture(scope="module")
def spec(raw_v1, header):
    return Manifest.from_json(raw_v1, weights_header=header)


@pytest.fixture
def m(spec):
    """A fresh schema-2 manifest dict to edit."""
    return copy.deepcopy(spec.to_json())


def refused(m, header, pattern):
    with pytest.raises(BundleError, match=pattern) as e:
        Manifest.from_json(m, weights_header=header, where="bundle 'x.nfx'")
    return e.value


def node_index(m, name):
    return next(i for i, n in enumerate(m["capacity"]["program"]) if n["name"] == name)


# --------------------------------------------------------------------------------------------
# the records, and the round trip


def test_the_manifest_is_typed_records(spec):
    assert isinstance(spec.capacity.program, Program) and spec.capacity.program.nodes[0].op == "input"
    assert isinstance(spec.levels[0], LevelRow) and spec.levels[0].latency_ms == {"1": 1.0, "64": 10.0}
    flex = spec.exit_set("flexdnn")
    assert flex is spec.exit_set("flex_exits") and flex.key == "flex_exits" and flex.num_early == 2
    assert isinstance(flex.plan, ExitPlan) and isinstance(flex.operating_points[0], OperatingPoint)
    assert flex.heads[0].index_tensor() == "flex_exits.0.index" and flex.heads[0].filters
    assert isinstance(spec.splits[0].quantization.per_bits[0], QuantizationRow)
    assert spec.precision.assignment == {"features.conv1": "float32", "features.conv2": "int8"}
    assert spec.weights.tensors[CONV1] == TensorInfo((8, 3, 3, 3), "float32")
    with pytest.raises(AttributeError):  # frozen
        spec.num_classes = 3


def test_to_json_and_from_json_round_trip(spec, header):
    again = Manifest.from_json(spec.to_json(), weights_header=header)
    assert again == spec and again.to_json() == spec.to_json()
    assert again.schema_version == 2 and spec.schema_version == 1  # what was on disk; not compared
    # json text too: plain JSON types only
    assert Manifest.from_json(json.loads(json.dumps(spec.to_json(), allow_nan=False))) == spec


def test_unknown_additive_keys_are_kept(m, header):
    m["future"] = {"a": 1}
    m["levels"][0]["energy_mj"] = 1.5
    m["exit_sets"][1]["heads"][0]["program"][2]["hint"] = "x"
    again = Manifest.from_json(m, weights_header=header)
    assert again.extra == {"future": {"a": 1}} and again.levels[0].extra == {"energy_mj": 1.5}
    assert again.to_json() == m


def test_the_runtime_runs_exactly_the_schema_ops():
    assert set(runtime.OPS) | set(runtime._BINARY) | set(runtime._SPECIAL) == set(PROGRAM_OPS)


def test_schema_1_keys_are_upgraded_and_refused_in_schema_2(raw_v1, m, header):
    v1 = copy.deepcopy(raw_v1)
    v1["exit_sets"] = []
    refused(v1, header, r"`exit_sets` is a schema-2 key in a schema-1 manifest")
    m["exits"] = m["exit_sets"][0]
    refused(m, header, r"`exits` is a schema-1 key; schema 2 lists exit sets in `exit_sets`")


def test_a_bundle_holds_one_exit_set_per_kind(m, header):
    m["exit_sets"][1] = copy.deepcopy(m["exit_sets"][0])
    refused(m, header, r"`exit_sets\[1\].kind` repeats kind 'progressive' \(also exit_sets\[0\]\)")


# --------------------------------------------------------------------------------------------
# types, finite numbers, ranges


@pytest.mark.parametrize("edit, pattern", [
    (lambda m: m["levels"][1].update(memory_mb="big"),
     r"`levels\[1\].memory_mb` must be a finite number >= 0, got 'big' \(string\)"),
    (lambda m: m["capacity"].update(num_levels=3.0), r"`capacity.num_levels` must be an int >= 1, got 3.0 \(number\)"),
    (lambda m: m["exit_sets"][0].update(thresholds="0.5"),
     r"`exit_sets\[0\].thresholds` must be a list of finite numbers in \[0, 1\], got '0.5' \(string\)"),
    (lambda m: m["exit_sets"][0].update(thresholds=[0.5, 1.5]),
     r"`exit_sets\[0\].thresholds\[1\]` must be a finite number in \[0, 1\], got 1.5 \(number\). HINT: confidences"),
    (lambda m: m["input"].update(shape={"c": 3}), r"`input.shape` must be a list of ints >= 1, got \{'c': 3\} \(object\)"),
    (lambda m: m.update(producer=[]), r"`producer` must be an object, got \[\] \(array\)"),
    (lambda m: m["weights"]["tensors"][CONV1].update(shape=[8, "3", 3, 3]),
     r"`weights.tensors\['backbone.features.conv1.weight'\].shape\[1\]` must be an int >= 0, got '3' \(string\)"),
    (lambda m: m["levels"][0].update(accuracy=91),
     r"`levels\[0\].accuracy` must be a finite number in \[0, 1\] or null, got 91 \(number\). HINT: accuracies are "
     r"fractions"),
    (lambda m: m["levels"][2].update(level=1), r"`levels\[2\].level` must be 2 \(rows are listed smallest level first\)"),
    (lambda m: m["exit_sets"][0].update(confidence="softmax"),
     r"`exit_sets\[0\].confidence` must be one of 'entropy', 'max_prob', got 'softmax'"),
    (lambda m: m["exit_sets"][1].update(fallback=None), r"`exit_sets\[1\].fallback` must be one of 'most_confident', "
                                                        r"'final', got None \(null\)"),
    (lambda m: m["splits"][0]["quantization"]["per_bits"][1].update(bits=64),
     r"`splits\[0\].quantization.per_bits\[1\].bits` must be an int in \[1, 32\] or null, got 64"),
    (lambda m: m["files"]["weights.safetensors"].update(sha256="abc"),
     r"`files\['weights.safetensors'\].sha256` must be 64 lowercase hex digits, got 'abc'"),
    (lambda m: m["input"].update(std=[0.25, 0.0, 0.25]), r"`input.std` must hold numbers > 0"),
    (lambda m: m["input"].update(scale=0), r"`input.scale` must be a finite number > 0 or null, got 0 \(number\)"),
    (lambda m: m["switching"][0].update(to=3), r"`switching\[0\].to` must be a level in \[0, 2\], got 3"),
    (lambda m: m["exit_sets"][1]["operating_points"][0].pop("threshold"),
     r"`exit_sets\[1\].operating_points\[0\].threshold` is missing \(or `thresholds`, one per early exit\)"),
    (lambda m: m["profiles"].update(layer_precision="../../etc/passwd"),
     r"`profiles.layer_precision` must be a path inside the bundle \(relative, no '..'\)"),
    (lambda m: m["precision"].update(file="profiles/other.json"),
     r"`precision.file` names 'profiles/other.json', which `files` does not list"),
    (lambda m: m["files"].pop("weights.safetensors"), r"`files` does not list weights.safetensors"),
])
def test_a_field_of_the_wrong_type_or_range_is_named(m, header, edit, pattern):
    edit(m)
    e = refused(m, header, r"bundle 'x.nfx': manifest.json is invalid \(\d+ problems?\): .*" + pattern)
    assert str(e).endswith("HINT: the manifest was edited by hand or written by a broken exporter; export the bundle "
                           "again (nestflex.export.export_bundle)")


def test_nan_and_infinity_are_refused_anywhere(m, header):
    m["levels"][0]["memory_mb"] = float("nan")
    m["model"]["width"] = float("inf")  # free-form provenance too
    m["exit_sets"][0]["calibration"]["lossless"]["accuracy"] = float("-inf")
    e = refused(m, header, r"\(3 problems\)")
    assert "`levels[0].memory_mb` must be a finite number, got nan (number). HINT: JSON has no NaN or Infinity" \
        in e.problems
    assert {p.split("`")[1] for p in e.problems} == {"levels[0].memory_mb", "model.width",
                                                     "exit_sets[0].calibration.lossless.accuracy"}


def test_every_problem_is_reported_at_once(m, header):
    m["levels"][0]["params"] = -1
    m["capacity"]["program"][1]["op"] = "hardswish"
    m["exit_sets"][1]["heads"][0]["filters"][0] = 999
    m["classes"].pop()
    e = refused(m, header, r"\(4 problems\)")
    assert [p.split("`")[1] for p in e.problems] == ["classes", "levels[0].params", "capacity.program[1].op",
                                                     "exit_sets[1].heads[0].filters"]


def test_many_problems_are_capped_in_the_message_but_all_listed(m, header):
    for name in m["weights"]["tensors"]:
        m["weights"]["tensors"][name]["dtype"] = "float8"
    e = refused(m, header, r"; and \d+ more \(BundleError.problems lists them all\)")
    assert len(e.problems) == len(m["weights"]["tensors"]) > 25


# --------------------------------------------------------------------------------------------
# programs


def test_an_unknown_op_is_refused(m, header):
    m["capacity"]["program"][1]["op"] = "hardswish"
    refused(m, header, r"`capacity.program\[1\].op` names op 'hardswish' \(string\), which this runtime does not know; "
                       r"known: adaptive_avg_pool2d, .*, relu6, reshape, softmax, sub, transpose. HINT: a newer nestflex may know it; upgrade")


def test_an_argument_naming_an_unknown_or_later_node_is_refused(m, header):
    i = node_index(m, "features_bn1")
    m["capacity"]["program"][i]["args"] = ["nope"]
    m["capacity"]["program"][i + 1]["args"] = ["features_conv2"]  # defined later
    e = refused(m, header, r"\(2 problems\)")
    assert e.problems[0] == (f"`capacity.program[{i}].args[0]` names 'nope', which is not an earlier node of this "
                             f"program (a `batch_norm` node 'features_bn1' reads only nodes defined before it)")
    assert e.problems[1].startswith(f"`capacity.program[{i + 1}].args[0]` names 'features_conv2', which is not an "
                                    f"earlier node")


@pytest.mark.parametrize("edit, pattern", [
    (lambda p: p[1].update(args=["x", "x"]), r"`capacity.program\[1\].args` has 2 arguments, a `conv2d` node "
                                             r"'features_conv1' takes 1"),
    (lambda p: p[1]["attrs"].pop("stride"), r"`capacity.program\[1\].attrs.stride` is missing; a `conv2d` node "
                                            r"'features_conv1' needs it"),
    (lambda p: p[1]["attrs"].update(stride=[1, 0]), r"`capacity.program\[1\].attrs.stride` must be an int >= 1 or a "
                                                    r"list of two, got \[1, 0\]"),
    (lambda p: p[2]["attrs"].update(eps=-1e-5), r"`capacity.program\[2\].attrs.eps` must be a finite number > 0"),
    (lambda p: p[1]["params"].update(weight="nope"), r"`capacity.program\[1\].params.weight` names tensor 'nope', "
                                                     r"which weights.tensors does not hold"),
    (lambda p: p[1]["params"].update(gain="x"), r"`capacity.program\[1\].params.gain` is not a role a `conv2d` node "
                                                r"'features_conv1' reads; roles: weight, bias"),
    (lambda p: p[1].pop("params"), r"`capacity.program\[1\].params` is missing; a `conv2d` node 'features_conv1' "
                                   r"reads weight"),
    (lambda p: p[0].update(op="relu", args=[]), r"`capacity.program\[0\].args` has 0 arguments"),
    (lambda p: p.pop(), r"`capacity.program\[\d+\]` must be the program's one `output` node"),
    (lambda p: p[2].update(name="features_conv1"), r"`capacity.program\[2\].name` repeats node name 'features_conv1'"),
    (lambda p: p[2]["params_per_level"].pop(), r"`capacity.program\[2\].params_per_level` has 2 entries, expected 1 or "
                                               r"3"),
    (lambda p: p[1].update(params_per_level=[p[1]["params"]]), r"`capacity.program\[1\].params_per_level` is not "
                                                                r"allowed on a `conv2d` node"),
    (lambda p: p[-1].update(args=[3]), r"`capacity.program\[\d+\].args\[0\]` must be a node name"),
])
def test_program_nodes_are_checked(m, header, edit, pattern):
    edit(m["capacity"]["program"])
    refused(m, header, pattern)


def test_a_head_program_is_checked_too(m, header):
    prog = m["exit_sets"][1]["heads"][0]["program"]
    prog[2]["args"] = ["x", "x"]  # index_select's index must be the `param` node
    refused(m, header, r"`exit_sets\[1\].heads\[0\].program\[2\].args\[1\]` must name a `param` node \(the index "
                       r"tensor\), got node 'x' \(input\)")


# --------------------------------------------------------------------------------------------
# regions, levels, shapes


def test_a_region_larger_than_its_tensor_is_refused(m, header):
    m["capacity"]["regions"][CONV1][2] = [9, 3, 3, 3]  # the tensor is [8, 3, 3, 3]
    m["capacity"]["regions"][CONV1][1] = [6, 3, 3]
    e = refused(m, header, r"\(2 problems\)")
    assert e.problems == (
        f"`capacity.regions['{CONV1}'][1]` must be a shape of rank 4 inside the tensor's [8, 3, 3, 3] (each 0 <= r "
        f"<= dim), got [6, 3, 3] (array)",
        f"`capacity.regions['{CONV1}'][2]` must be a shape of rank 4 inside the tensor's [8, 3, 3, 3] (each 0 <= r "
        f"<= dim), got [9, 3, 3, 3] (array)",
    )


def test_a_region_inconsistent_with_its_neighbours_is_refused(m, header):
    # inside its tensor, but level 0's conv2 would read more channels than conv1 gives it
    conv2 = "backbone.features.conv2.weight"
    region = m["capacity"]["regions"][conv2][0]
    region[1] += 1
    refused(m, header, r"`capacity.program\[\d+\]` \(conv2d 'features_conv2'\) reads 1 channels at level 0, but its "
                       r"weight region \[4, 2, 3, 3\] takes 2")


def test_the_level_count_must_agree_everywhere(m, header):
    m["levels"].pop()
    refused(m, header, r"`levels` has 2 rows, but capacity.num_levels is 3 \(one row per level\)")
    m = copy.deepcopy(m)
    m["capacity"]["num_levels"] = 2
    e = refused(m, header, r"`capacity.level_bytes` has 3 entries, expected 2 \(one per level, `num_levels`\)")
    assert any(p.startswith(f"`capacity.regions['{CONV1}']` has 3 entries, expected 2") for p in e.problems)


def test_a_level_that_reads_a_tensor_without_a_region_is_refused(m, header):
    m["capacity"]["regions"]["backbone.features.bn1.levels.1.running_mean"][1] = None
    refused(m, header, r"`capacity.program\[2\].params` \(node 'features_bn1'\) reads "
                       r"'backbone.features.bn1.levels.1.running_mean' at level 1, but capacity.regions gives that "
                       r"level no region of it")


def test_level_bytes_must_be_what_the_level_reads(m, header):
    m["capacity"]["level_bytes"][0] += 4
    m["levels"][0]["weight_bytes"] += 4
    refused(m, header, r"`capacity.level_bytes\[0\]` must be the bytes level 0 reads \(25156, from the program's "
                       r"tensors and regions\), got 25160")


def test_the_tensor_table_must_match_the_weights_header(m, header):
    other = {**header, CONV1: {**header[CONV1], "shape": [8, 3, 3, 4]}, "extra.t": header[CONV1]}
    del other["exits.0.alpha"]
    e = refused(m, other, r"\(3 problems\)")
    assert e.problems == (
        "`weights.tensors['backbone.features.conv1.weight']` says float32[8, 3, 3, 3], but weights.safetensors holds "
        "float32[8, 3, 3, 4]",
        "`weights.tensors['exits.0.alpha']` is in the manifest but not in weights.safetensors",
        "`weights.tensors` does not list tensors weights.safetensors holds: ['extra.t']",
    )
    Manifest.from_json(m)  # without the header only the manifest's own consistency is checked ...
    bad = dict(header, **{CONV1: {"dtype": 7, "shape": "x"}})
    refused(m, bad, r"cannot be checked: weights.safetensors gives it no valid shape")  # ... and a bad header is named


# --------------------------------------------------------------------------------------------
# exit sets and split points


def test_exit_taps_are_backbone_nodes_in_order(m, header):
    m["exit_sets"][0]["taps"] = ["nope", m["exit_sets"][0]["taps"][0]]
    m["exit_sets"][1]["taps"] = list(reversed(m["exit_sets"][1]["taps"]))
    e = refused(m, header, r"`exit_sets\[0\].taps\[0\]` names 'nope', which is not a node of the backbone program "
                           r"\(capacity.program\) a head can read")
    assert "`exit_sets[1].taps[1]` names 'features_relu3', which does not come after the previous tap; taps are in " \
           "execution order" in e.problems
    # the heads were built for the other taps: their channels no longer match
    assert "`exit_sets[1].heads[0].tap_channels` must be the channels of tap 'features_relu5' (64), got 32 " \
           "(number)" in e.problems


def test_flexdnn_filters_stay_inside_the_tapped_channels(m, header):
    head = m["exit_sets"][1]["heads"][0]
    head["filters"][3] = head["tap_channels"]
    refused(m, header, r"`exit_sets\[1\].heads\[0\].filters` holds index 32, outside the tapped layer's 32 channels "
                       r"\(\[0, 31\]\)")
    head["filters"][3] = head["filters"][0]
    refused(m, header, r"`exit_sets\[1\].heads\[0\].filters` repeats a filter index")


def test_tap_channels_and_the_index_tensor_agree_with_the_program(m, header):
    head = m["exit_sets"][1]["heads"][0]
    head["tap_channels"] = 64
    refused(m, header, r"`exit_sets\[1\].heads\[0\].tap_channels` must be the channels of tap 'features_relu3' "
                       r"\(32\), got 64")
    head["tap_channels"] = 32
    head["filters"].pop()
    refused(m, header, r"`exit_sets\[1\].heads\[0\].filters` lists 15 filters, but the index tensor "
                       r"'flex_exits.0.index' holds \[16\]")


def test_a_shared_backbone_runs_at_the_largest_level(m, header):
    m["exit_sets"][0]["level"] = 0
    m["exit_sets"][1]["program"] = m["capacity"]["program"]
    e = refused(m, header, r"\(2 problems\)")
    assert "`exit_sets[1].program` must be absent for a `shared` backbone" in e.problems[0]
    assert e.problems[1].startswith("`exit_sets[0].level` must be 2 (the largest level: a shared backbone runs there)")


def test_split_points_cut_the_capacity_program(m, header):
    m["splits"][1]["node"] = "nope"
    m["splits"][2]["numel"] += 1
    e = refused(m, header, r"\(2 problems\)")
    assert "`splits[2].float32_bytes` must be 4 * numel (8196), got 8192 (number)" in e.problems
    assert any(p.startswith("`splits[1].node` names 'nope', which is not a node of capacity.program") for p in e.problems)


# --------------------------------------------------------------------------------------------
# whatever the JSON holds: a BundleError or a Manifest, never another exception


def _paths(obj, prefix=()):
    stack = [(obj, prefix)]
    while stack:
        v, p = stack.pop()
        yield p
        if isinstance(v, dict):
            stack += [(x, (*p, k)) for k, x in v.items()]
        elif isinstance(v, list):
            stack += [(x, (*p, i)) for i, x in enumerate(v)]


BAD_VALUES = [None, "x", -1, 2.5, float("nan"), float("inf"), [], {}, True, [None], {"": []}, 10**40]


def _sweep(spec, header, paths, values) -> int:
    """Put each value at each path (or delete the key): a Manifest that round-trips, or a BundleError."""
    base = spec.to_json()
    n = 0
    for path in paths:
        parent = base
        for k in path[:-1]:
            parent = parent[k]
        old = parent[path[-1]]
        for value in values(path):
            if value == "delete":
                del parent[path[-1]]
            else:
                parent[path[-1]] = value
            try:  # the edit is undone below; nothing read here outlives it
                got = Manifest.from_json(base, weights_header=header)
                assert Manifest.from_json(got.to_json(), weights_header=header) == got
            except BundleError as e:
                assert e.problems and all(isinstance(p, str) and p.startswith("`") for p in e.problems), path
                assert "nestflex bug" not in str(e), (path, value, str(e))
            finally:
                if value == "delete" and isinstance(parent, list):
                    parent.insert(path[-1], old)
                else:
                    parent[path[-1]] = old
            n += 1
    assert base == spec.to_json()  # every edit was undone
    return n


def test_any_field_of_any_type_gives_a_bundle_error_or_a_manifest(spec, header):
    # a sample, fast: one field in four outside the programs, a few program and region entries
    rng = random.Random(0)
    paths = [p for p in _paths(spec.to_json()) if p]
    shallow = [p for p in paths if not {"program", "regions", "tensors"} & set(map(str, p))]
    sample = rng.sample(shallow, len(shallow) // 4) + rng.sample([p for p in paths if p not in shallow], 25)
    assert _sweep(spec, header, sample, lambda p: rng.sample([*BAD_VALUES, "delete"], 2)) >= 200


def test_every_field_of_any_type_gives_a_bundle_error_or_a_manifest(spec, header):
    # every field outside the programs with every value; every program/region/tensor entry with three
    # of them, in turn (about 12k reads, ~3 min on 2 cores)
    paths = [p for p in _paths(spec.to_json()) if p]
    values = [*BAD_VALUES, "delete"]
    turn = iter(range(10**9))

    def pick(path):
        if not {"program", "regions", "tensors"} & set(map(str, path)):
            return values
        i = next(turn)
        return [values[(3 * i + j) % len(values)] for j in range(3)]

    _sweep(spec, header, paths, pick)


def test_a_deeply_nested_or_non_json_value_is_a_bundle_error(m, header):
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    m["model"] = {"x": deep}
    refused(m, header, r"`model.x(\[0\])+` is nested deeper than 32 levels")
    refused([1, 2], header, r"`manifest` must be a JSON object, got \[1, 2\] \(array\)")
    refused({"format": "nestflex-bundle", "schema_version": 2}, None, r"`producer` is missing")


def test_sub_records_read_alone(m):
    row = LevelRow.from_json(m["levels"][1], path="levels[1]", index=1)
    assert row.to_json() == m["levels"][1]
    with pytest.raises(BundleError, match=r"^`levels\[1\]` is invalid \(1 problem\): `levels\[1\].level` must be 2"):
        LevelRow.from_json(m["levels"][1], path="levels[1]", index=2)
    prog = Program.from_json(m["capacity"]["program"])
    assert prog.to_json() == m["capacity"]["program"] and prog.names[0] == "x"
    with pytest.raises(BundleError, match=r"`program` is empty"):
        Program.from_json([])
    q = SplitQuantization.from_profile({"name": "s", "lowest_bits": {"1": 4}, "fixed_range": [0, 1],
                                          "per_bits": [{"bits": 4, "accuracy": 0.5, "drop_points": 0.1}]})
    assert q.per_bits[0] == QuantizationRow(4, 0.5) and "drop_points" not in q.to_json()["per_bits"][0]
    ex = ExitSet.from_json(m["exit_sets"][1])
    assert replace(ex, thresholds=(0.1, 0.2)).to_json()["thresholds"] == [0.1, 0.2]


def test_show_never_fails():
    assert _show(float("nan")) == "nan (number)"
    assert _show("x" * 100).endswith("... (string)")
    assert _show(10**5000) == "... (number)"  # too long to print: not an error
