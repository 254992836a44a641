"""The per-layer latency table: measured in real onnxruntime, interpolated, saved and read back,
built by the torch-free ``nestflex latency-table`` verb."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nestflex.errors import ProfileError
from nestflex.profiling import LatencyTable, LayerSpec, measure_table, read_layer_specs, write_layer_specs
from nestflex.profiling.latency import coarse_widths, fine_widths

ROOT = Path(__file__).resolve().parents[2]
CONV = LayerSpec("conv", 64, 64, kernel=(3, 3), padding=(1, 1), in_hw=(16, 16))


@pytest.fixture(scope="module")
def table():
    return measure_table([CONV, CONV, LayerSpec("linear", 32, 10)], threads=1, batch=1, repeats=3)


def test_a_measured_table_has_one_entry_per_shape_and_time_falls_with_width(table):
    assert len(table.entries) == 2  # the repeated conv is measured once
    e = table.entries[CONV.key]
    assert e["fine"] == fine_widths(64) and e["grid_in"] == coarse_widths(64) == e["grid_out"]
    # a 3x3 conv over 16x16 at 8 of 64 output channels does an eighth of the work: it must be
    # clearly faster (by far more than the timer's noise), at full and at a narrow input alike
    assert table.layer_ms(CONV, 64, 8) < 0.6 * table.layer_ms(CONV, 64, 64)
    assert table.layer_ms(CONV, 8, 64) < 0.6 * table.layer_ms(CONV, 64, 64)
    assert table.layer_ms(CONV, 64, 64) == pytest.approx(e["fine_ms"][-1])
    fast = table.fast_widths(CONV)
    assert fast[-1] == 64 and set(fast) <= set(e["fine"]) and fast == sorted(fast)


def test_fast_widths_are_the_widths_faster_than_every_larger_one_beyond_the_margin():
    spec = LayerSpec("conv", 3, 64, kernel=(3, 3), in_hw=(8, 8))
    fine = [16, 32, 48, 64]
    t = LatencyTable({spec.key: {"spec": spec.to_dict(), "fine": fine, "fine_ms": [1.0, 1.01, 2.0, 2.0],
                                 "grid_in": [], "grid_out": [], "grid_ms": []}})
    # 48 is no faster than 64, 16 saves 1% over 32 (noise under the 3% margin): the steps are 32 and 64
    assert t.fast_widths(spec) == [32, 64] and t.fast_widths(spec, margin=0.0) == [16, 32, 64]
    assert t.layer_ms(spec, 3, 40) == pytest.approx(1.01 + (2.0 - 1.01) / 2)
    assert t.layer_ms(spec, 3, 8) == pytest.approx(0.5)  # below the sweep: in proportion, toward zero


def test_a_pruned_layer_is_priced_by_the_smallest_measured_layer_of_its_shape_that_covers_it(table):
    pruned = LayerSpec("conv", 40, 24, kernel=(3, 3), padding=(1, 1), in_hw=(16, 16))
    assert table.lookup(pruned) is table.entries[CONV.key]
    assert table.layer_time(pruned) == pytest.approx(table.layer_ms(CONV, 40, 24))
    with pytest.raises(ProfileError, match=r"no layer of shape .*in8x8.* HINT: build the table"):
        table.layer_time(LayerSpec("conv", 4, 4, kernel=(3, 3), padding=(1, 1), in_hw=(8, 8)))


def test_the_table_round_trips_through_its_json(table, tmp_path):
    path = table.save(tmp_path / "t.json")
    back = LatencyTable.load(path)
    assert back.to_dict() == json.loads(path.read_text()) and back.layer_ms(CONV, 30, 30) == table.layer_ms(CONV, 30, 30)
    assert not list(tmp_path.glob("*.tmp"))  # written atomically: no leftover
    with pytest.raises(ProfileError, match="does not exist. HINT: build it with `nestflex latency-table"):
        LatencyTable.load(tmp_path / "missing.json")
    with pytest.raises(ProfileError, match="schema 0"):
        LatencyTable.from_dict(table.to_dict() | {"schema_version": 0})


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"kind": "pool"}, "`kind` must be one of"),
    ({"in_channels": 0}, "`in_channels` must be an int >= 1, got 0"),
    ({"depthwise": True, "out_channels": 3}, "as many input as output channels"),
])
def test_bad_specs_are_refused_by_name(kwargs, match):
    with pytest.raises(ProfileError, match=match):
        LayerSpec(**({"kind": "conv", "in_channels": 4, "out_channels": 4} | kwargs))


def test_measure_refuses_bad_settings():
    with pytest.raises(ProfileError, match="`threads` must be an int >= 1, got 0"):
        measure_table([CONV], threads=0)


def test_the_device_verb_builds_the_table_without_torch(tmp_path):
    specs = [LayerSpec("conv", 8, 16, kernel=(3, 3), padding=(1, 1), in_hw=(8, 8)),
             LayerSpec("conv", 16, 16, kernel=(3, 3), padding=(1, 1), in_hw=(8, 8), depthwise=True)]
    write_layer_specs(specs, tmp_path / "specs.json", model="toy")
    assert read_layer_specs(tmp_path / "specs.json") == specs
    code = ("import sys, json; from nestflex.cli import main; "
            f"rc = main(['latency-table', {str(tmp_path / 'specs.json')!r}, '--out', {str(tmp_path / 't.json')!r}, "
            "'--repeats', '2', '--quiet']); "
            "print(json.dumps([rc, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnx'))]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rc, heavy = json.loads(done.stdout.strip().splitlines()[-1])
    assert rc == 0 and heavy == []
    table = LatencyTable.load(tmp_path / "t.json")
    assert set(table.entries) == {s.key for s in specs} and table.entries[specs[1].key]["grid_in"] == []
    assert table.layer_time(specs[1]) > 0


def test_the_verb_names_a_missing_spec_file(tmp_path, capsys):
    from nestflex.cli import main

    assert main(["latency-table", str(tmp_path / "nope.json")]) == 2
    assert "layer specs" in capsys.readouterr().err
