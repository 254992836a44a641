"""Corrupt, tampered, missing or future bundles are refused with one clear message."""

import json
import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path

import pytest
import torch

import nestflex.deploy as nd
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.manifest import manifest_digest
from tests.export.bundles import write_bundle


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    info, _, _ = write_bundle(tmp_path_factory.mktemp("load"), onnx=False)
    return info["bundle"]


@pytest.fixture
def bundle(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "copy.nfx")


def _rewrite(root, edit, redigest=True):
    path = root / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    if redigest:
        m["integrity"]["manifest_sha256"] = manifest_digest(m)
    path.write_text(json.dumps(m))


def test_a_good_bundle_loads(bundle):
    b = nd.load(bundle)
    assert b.num_levels == 3 and len(b.exits["names"]) == 3 and "levels=3, exits=3" in repr(b)
    assert {"level", "accuracy", "params", "macs", "memory_mb", "latency_ms"} <= set(b.levels[0])
    assert b.manifest["levels"] is b.levels


def test_a_flipped_byte_in_the_weights_is_refused(bundle):
    path = bundle / "weights.safetensors"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(nd.BundleError, match=r"is corrupt or was tampered with: file 'weights.safetensors' fails its "
                                             r"sha256 checksum.*HINT: copy the bundle again"):
        nd.load(bundle)


def test_an_edited_manifest_is_refused(bundle):
    _rewrite(bundle, lambda m: m["exit_sets"][0].update(thresholds=[0.1, 0.1]), redigest=False)
    with pytest.raises(nd.BundleError, match=r"manifest.json was modified after export \(its digest does not match"):
        nd.load(bundle)


def test_a_missing_file_is_refused(bundle):
    (bundle / "profiles" / "exit_calibration.json").unlink(missing_ok=True)
    (bundle / "weights.safetensors").unlink()
    with pytest.raises(nd.BundleError, match=r"file 'weights.safetensors' is missing"):
        nd.load(bundle)
    shutil.rmtree(bundle)
    with pytest.raises(nd.BundleError, match=r"copy.nfx' does not exist. HINT: write one with"):
        nd.load(bundle)


def test_a_future_schema_version_is_refused(bundle):
    _rewrite(bundle, lambda m: m.update(schema_version=nd.SCHEMA_VERSION + 1))
    with pytest.raises(nd.BundleError, match=rf"has schema_version {nd.SCHEMA_VERSION + 1}, written by nestflex .*; "
                                             rf"this runtime \(nestflex .*\) reads schema_version <= "
                                             rf"{nd.SCHEMA_VERSION}. HINT: upgrade"):
        nd.load(bundle)


def test_another_major_producer_version_is_refused(bundle):
    _rewrite(bundle, lambda m: m["producer"].update(version="7.0.0"))
    with pytest.raises(nd.BundleError, match=r"written by nestflex 7.0.0, a different major version"):
        nd.load(bundle)


def test_a_manifest_that_does_not_match_the_weights_is_refused(bundle):
    def shrink(m):
        name = next(iter(m["weights"]["tensors"]))
        m["weights"]["tensors"][name]["shape"][0] += 1

    _rewrite(bundle, shrink)
    with pytest.raises(nd.BundleError, match=r"manifest.json is invalid \(\d+ problems?\): `weights.tensors\['backbone\."
                                             r"features.conv1.weight'\]` says float32\[9, 3, 3, 3\], but "
                                             r"weights.safetensors holds float32\[8, 3, 3, 3\].*HINT: the manifest"):
        nd.load(bundle)


def test_not_a_bundle_is_explained(tmp_path):
    (tmp_path / "file.nfx").write_text("x")
    with pytest.raises(nd.BundleError, match=r"file.nfx' is a file, not a bundle directory"):
        nd.load(tmp_path / "file.nfx")
    (tmp_path / "empty.nfx").mkdir()
    with pytest.raises(nd.BundleError, match=r"empty.nfx' has no manifest.json"):
        nd.load(tmp_path / "empty.nfx")
    (tmp_path / "empty.nfx" / "manifest.json").write_text("{not json")
    with pytest.raises(nd.BundleError, match=r"manifest.json is not valid JSON"):
        nd.load(tmp_path / "empty.nfx")


@pytest.fixture(scope="module")
def flex_pristine(tmp_path_factory):
    from tests.export.bundles import write_flex_bundle

    info, *_ = write_flex_bundle(tmp_path_factory.mktemp("load_flex"), onnx=False)
    return info["bundle"]


@pytest.fixture
def flex_bundle(flex_pristine, tmp_path):
    return shutil.copytree(flex_pristine, tmp_path / "flex.nfx")


def test_a_flipped_filter_index_of_a_flex_exit_is_refused(flex_bundle):
    path = flex_bundle / "weights.safetensors"
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    start, _ = json.loads(data[8 : 8 + n])["flex_exits.0.index"]["data_offsets"]
    data[8 + n + start] ^= 0x01  # another filter feeds the exit: wrong answers, same shapes
    path.write_bytes(bytes(data))
    with pytest.raises(nd.BundleError, match=r"file 'weights.safetensors' fails its sha256 checksum"):
        nd.load(flex_bundle)


def test_an_inconsistent_exit_set_is_refused_in_one_message(flex_bundle):
    def break_both(m):
        m["exit_sets"][1]["thresholds"] = [0.5]
        m["exit_sets"][0]["backbone"] = "own"  # without its program

    _rewrite(flex_bundle, break_both)
    with pytest.raises(nd.BundleError, match=r"manifest.json is invalid \(2 problems\): `exit_sets\[0\].program` is "
                                             r"missing; an `own` backbone stores its program here; "
                                             r"`exit_sets\[1\].thresholds` has 1 entries, expected 2 \(one per early "
                                             r"exit: `names` lists 3 exits, the final one last\).*HINT: the manifest"):
        nd.load(flex_bundle)


def test_corruption_and_manifest_problems_are_reported_together(flex_bundle):
    path = flex_bundle / "weights.safetensors"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    _rewrite(flex_bundle, lambda m: m["levels"][1].update(memory_mb=-1.5, accuracy=91), redigest=False)
    with pytest.raises(nd.BundleError) as e:
        nd.load(flex_bundle)
    assert re.search(r"flex.nfx' is corrupt or was tampered with: .*file 'weights.safetensors' fails its sha256 "
                     r"checksum.*HINT: copy the bundle again.* Also, manifest.json is invalid \(2 problems\): "
                     r"`levels\[1\].accuracy` must be a finite number in \[0, 1\] or null, got 91 \(number\). "
                     r"HINT: accuracies are fractions.*`levels\[1\].memory_mb` must be a finite number >= 0, got -1.5",
                     str(e.value))
    assert len(e.value.problems) == 4  # the digest, the checksum, two fields


def test_filters_that_differ_from_the_index_tensor_are_refused(flex_bundle):
    # consistent shapes, other values: the head would read other filters than the plan says
    _rewrite(flex_bundle, lambda m: m["exit_sets"][1]["heads"][0]["filters"].reverse())
    with pytest.raises(nd.BundleError, match=r"`exit_sets\[1\].heads\[0\].filters` is \[.*\]\.\.\., but the index "
                                             r"tensor 'flex_exits.0.index' in weights.safetensors holds"):
        nd.load(flex_bundle)


# wrong JSON types, NaN/Infinity, over-deep values: always one BundleError naming the field
BAD_EDITS = {
    "levels is a string": (lambda m: m.update(levels="x"), r"`levels` must be a list, got 'x' \(string\)"),
    "capacity is a list": (lambda m: m.update(capacity=[]), r"`capacity` must be an object, got \[\] \(array\)"),
    "exit_sets is an object": (lambda m: m.update(exit_sets={}), r"`exit_sets` must be a list or null"),
    "tensor table is a number": (lambda m: m["weights"].update(tensors=5), r"`weights.tensors` must be an object"),
    "files is a list": (lambda m: m.update(files=[]), r"`files` must be an object"),
    "producer torch is a number": (lambda m: m["producer"].update(torch=2), r"`producer.torch` must be a non-empty "
                                                                            r"string or null, got 2"),
    "memory is Infinity": (lambda m: m["levels"][0].update(memory_mb=float("inf")), r"manifest.json exceeds a JSON "
                                                                                    r"limit: it holds Infinity, which "
                                                                                    r"JSON does not have"),
    "memory is NaN": (lambda m: m["levels"][0].update(memory_mb=float("nan")), r"it holds NaN, which JSON does not "
                                                                               r"have .*HINT: the file is corrupt"),
    "a head is null": (lambda m: m["exit_sets"][0]["heads"].__setitem__(1, None), r"`exit_sets\[0\].heads\[1\]` "
                                                                                  r"must be an object, got None"),
    "a node's args is a string": (lambda m: m["capacity"]["program"][1].update(args="x"),
                                  r"`capacity.program\[1\].args` must be a list, got 'x'"),
    # deeper than the schema's 32 levels for free-form values, within the parser's 64
    "provenance nested too deep": (lambda m: m.update(model=json.loads("[" * 40 + "]" * 40)),
                                   r"`model(\[0\])+` is nested deeper than 32 levels"),
    "JSON nested too deep to parse": (lambda m: m.update(model=json.loads("[" * 200 + "]" * 200)),
                                      r"manifest.json exceeds a JSON limit: it nests 201 levels deep, above the limit "
                                      r"of 64. HINT"),
    "schema_version is a string": (lambda m: m.update(schema_version="2"), r"`schema_version` must be a positive "
                                                                          r"int, got '2'"),
}


@pytest.mark.parametrize("name", list(BAD_EDITS))
def test_a_field_of_the_wrong_type_is_one_bundle_error(bundle, name):
    edit, pattern = BAD_EDITS[name]
    path = bundle / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    try:
        m["integrity"]["manifest_sha256"] = manifest_digest(m)
    except ValueError:  # NaN, Infinity: not canonical JSON, so also a digest mismatch
        pass
    path.write_text(json.dumps(m))
    with pytest.raises(nd.BundleError, match=pattern):
        nd.load(bundle)


@pytest.mark.parametrize("literal, match", [
    ("1" + "0" * 5000, r"it holds a number literal of 5,001 characters \(10000000000000000000\.\.\.\), above the 100-"),
    ("1e999", r"it holds the number 1e999, beyond float64 \(it would read as inf\)"),
    ("-Infinity", r"it holds -Infinity, which JSON does not have"),
])
def test_a_number_json_cannot_hold_is_one_bundle_error(bundle, literal, match):
    path = bundle / "manifest.json"
    path.write_text(path.read_text().replace('"macs":', f'"macs":{literal},"was_macs":', 1))
    with pytest.raises(nd.BundleError, match=r"copy.nfx': manifest.json exceeds a JSON limit: " + match):
        nd.load(bundle)


# --------------------------------------------------------------------------------------------
# schema 1: the committed fixture was written by the exporter before schema 2 (tests/deploy/fixtures/README.md)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def v1(tmp_path):
    return shutil.copytree(FIXTURES / "bundle_v1.nfx", tmp_path / "v1.nfx")


def test_a_schema_1_bundle_loads_upgraded():
    b = nd.load(FIXTURES / "bundle_v1.nfx")
    raw = json.loads((FIXTURES / "bundle_v1.nfx" / "manifest.json").read_text())
    assert raw["schema_version"] == 1 and "exit_sets" not in raw
    assert b.spec.schema_version == 1 and b.manifest["schema_version"] == nd.SCHEMA_VERSION == 2
    assert [s.kind for s in b.spec.exit_sets] == ["progressive", "flexdnn"]
    # the sections read as they were written, now as a list with their kind
    assert b.exit_sets == {"exits": raw["exits"], "flex_exits": raw["flex_exits"]}
    assert b.exits == raw["exits"] and b.flex_exits == raw["flex_exits"]
    assert all(b.manifest[k] == raw[k] for k in raw if k not in ("schema_version", "exits", "flex_exits"))
    assert "schema_version=1" in repr(b)


def test_a_schema_1_bundle_runs_with_the_outputs_of_its_model():
    from safetensors.torch import load_file

    ref = load_file(str(FIXTURES / "bundle_v1_reference.safetensors"))  # the training model's outputs, and the
    b = nd.load(FIXTURES / "bundle_v1.nfx")                              # schema-1 runtime's, at export time
    x = ref["x"]
    rt, eager = nd.CapacityRuntime(b, 0), nd.CapacityRuntime(b, 0, plan="eager")
    for k in range(b.num_levels):
        rt.set_level(k), eager.set_level(k)
        torch.testing.assert_close(rt(x), ref[f"level_{k}"], atol=1e-5, rtol=0)
        # the torch reference to the last bits its thread count allows (the plan runs one thread; the
        # reference ran torch's default, whose reductions sum in another order)
        torch.testing.assert_close(eager(x), ref[f"runtime_level_{k}"], atol=1e-7, rtol=1e-6)
    for key, kind in (("exits", "progressive"), ("flex_exits", "flexdnn")):
        for plan in ("onnxruntime", "eager"):
            prog = nd.ProgressiveRuntime(b, rt if plan == "onnxruntime" else eager, exit_set=kind, plan=plan)
            for k, logits in enumerate(prog.all_exits(x)):
                torch.testing.assert_close(logits, ref[f"{key}_{k}"], atol=1e-5, rtol=0)
            out = prog(x)
            torch.testing.assert_close(out.logits, ref[f"runtime_{key}_logits"], atol=1e-5 if plan == "onnxruntime"
                                       else 1e-7, rtol=0 if plan == "onnxruntime" else 1e-6)
            assert torch.equal(out.exit_index, ref[f"runtime_{key}_exit_index"])
            assert torch.equal(out.answer_index, ref[f"runtime_{key}_answer_index"])
    head, tail = rt.split(b.splits[0]["name"])
    torch.testing.assert_close(tail(*head(x)), rt(x), atol=1e-5, rtol=0)


def test_a_schema_1_bundle_before_flex_exits_and_kind_still_loads_and_runs(v1):
    # the oldest schema-1 bundles: no `flex_exits` set, no `kind` key
    def older(m):
        del m["flex_exits"], m["exits"]["kind"]
        m["onnx"] = []

    _rewrite(v1, older)
    b = nd.load(v1)
    assert list(b.exit_sets) == ["exits"] and b.flex_exits is None and b.exits["kind"] == "progressive"
    assert nd.ProgressiveRuntime(b)(torch.randn(2, 3, 32, 32)).logits.shape == (2, 10)


def test_schema_1_problems_are_reported_under_its_own_keys(v1):
    def broken(m):
        m["flex_exits"]["kind"] = "progressive"
        m["exits"]["taps"][1] = "nope"

    _rewrite(v1, broken)
    with pytest.raises(nd.BundleError, match=r"`flex_exits.kind` must be 'flexdnn' under `flex_exits`, got "
                                             r"'progressive' \(string\).*`exits.taps\[1\]` names 'nope', which is "
                                             r"not a node of the backbone program"):
        nd.load(v1)


# ---------------------------------------------------------------------------------------- special files


@pytest.fixture
def plain_bundle(tmp_path):
    info, _, _ = write_bundle(tmp_path, onnx=False)
    return Path(info["bundle"])


def _bytes_read():
    """Bytes this process has read so far: /proc/self/io's rchar (every read call, every thread)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar line")


def _refused(root, match):
    """``nd.load(root)`` is refused with ``match``, without blocking and without reading the odd file.

    Checked by behaviour, not by a time limit: the load runs in a thread that must finish (a FIFO
    opened for reading with no writer would block it for good: 60 s only bounds how long the test
    waits to say so; the refusal itself takes milliseconds), and the bytes the process read meanwhile
    must stay below the bundle's own regular files plus 1 MiB (reading /dev/urandom or a 64 MiB
    manifest would not)."""
    files = sum(p.stat().st_size for p in Path(root).rglob("*") if not p.is_symlink() and p.is_file())
    outcome = {}

    def load():
        try:
            nd.load(root)
            outcome["error"] = None
        except BaseException as e:  # noqa: BLE001 - handed to the test thread below
            outcome["error"] = e

    before = _bytes_read()
    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():  # blocked: unblock it (a writer that closes at once gives the reader EOF)
        for p in Path(root).iterdir():
            if stat.S_ISFIFO(p.lstat().st_mode):
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"nd.load({str(root)!r}) blocked instead of refusing")
    read = _bytes_read() - before
    assert isinstance(outcome["error"], BundleError), outcome["error"]
    assert re.search(match, str(outcome["error"])), (match, str(outcome["error"]))
    assert read < files + (1 << 20), f"read {read:,} bytes to refuse a bundle of {files:,}"


def test_a_fifo_manifest_is_refused_without_blocking(plain_bundle):
    (plain_bundle / "manifest.json").unlink()
    os.mkfifo(plain_bundle / "manifest.json")
    _refused(plain_bundle, r"'manifest.json' is a FIFO, not a regular file")


def test_a_manifest_linked_to_a_device_or_out_of_the_bundle_is_refused(plain_bundle, tmp_path):
    m = plain_bundle / "manifest.json"
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes(m.read_bytes())
    m.unlink()
    m.symlink_to("/dev/urandom")
    _refused(plain_bundle, r"'manifest.json' is a link that leads out of the bundle \(to '/dev/urandom'\)")
    m.unlink()
    m.symlink_to(outside)
    _refused(plain_bundle, r"'manifest.json' is a link that leads out of the bundle")


def test_a_listed_member_that_is_a_fifo_or_a_link_out_is_a_problem(plain_bundle, tmp_path):
    w = plain_bundle / "weights.safetensors"
    outside = tmp_path / "w.safetensors"
    outside.write_bytes(w.read_bytes())
    w.unlink()
    w.symlink_to(outside)  # same bytes, same checksum: still refused, it is not the bundle's file
    _refused(plain_bundle, r"'weights.safetensors' is a link that leads out of the bundle")
    w.unlink()
    os.mkfifo(w)
    _refused(plain_bundle, r"'weights.safetensors' is a FIFO, not a regular file")


def test_a_huge_manifest_or_safetensors_header_is_refused_unread(plain_bundle):
    from nestflex.deploy.bundle.loader import MAX_MANIFEST_BYTES
    from nestflex.deploy.bundle.safetensors_header import MAX_HEADER_BYTES, read_safetensors_header

    m = plain_bundle / "manifest.json"
    with open(m, "r+b") as f:  # sparse: 64 MiB + 1 of apparent size, nothing written
        f.truncate(MAX_MANIFEST_BYTES + 1)
    _refused(plain_bundle, rf"manifest.json has {MAX_MANIFEST_BYTES + 1} bytes, above the {MAX_MANIFEST_BYTES}-byte limit")
    fake = plain_bundle / "big.safetensors"
    with open(fake, "wb") as f:
        f.write((MAX_HEADER_BYTES + 1).to_bytes(8, "little"))
        f.truncate(MAX_HEADER_BYTES + 64)
    with pytest.raises(BundleError, match=rf"header of {MAX_HEADER_BYTES + 1} bytes is above the"):
        read_safetensors_header(fake)


def _edit(root, fn):
    m = json.loads((root / "manifest.json").read_text())
    fn(m)
    m["integrity"] = {"manifest_sha256": manifest_digest(m)}  # a consistent-looking bundle: only shapes can tell
    (root / "manifest.json").write_text(json.dumps(m))


def _node(program, op):
    return next(n for n in program if n["op"] == op)


@pytest.mark.parametrize("edit, match", [
    (lambda m: _node(m["capacity"]["program"], "max_pool2d")["attrs"].update(stride=1000000),
     r"capacity program at level 0 fails shape inference \(OnnxGraphError"),
    (lambda m: _node(m["capacity"]["program"], "conv2d")["attrs"].update(padding=[1000000, 1000000]),
     r"capacity program at level 0: node '.*' produces [\d,]+ elements per sample, above"),
    (lambda m: _node(m["exit_sets"][0]["heads"][0]["program"], "flatten")["attrs"].update(start_dim=2),
     r"progressive exit 0 (head fails shape inference|ends in shape)"),
    # an output node with its argument twice: a tuple, not logits (found by benchmarks/deploy/fuzz.py; was an
    # AttributeError in the exit policy at the first frame)
    (lambda m: _node(m["exit_sets"][0]["heads"][0]["program"], "output")["args"].append("linear"),
     r"progressive exit 0 ends in 2 outputs, expected one tensor of logits"),
    (lambda m: m["capacity"]["program"][-1]["args"].extend(m["capacity"]["program"][-1]["args"]),
     r"capacity program at level 0 ends in 2 outputs, expected one tensor of logits"),
])
def test_fields_valid_alone_but_inconsistent_as_a_network_are_refused_before_running(plain_bundle, edit, match):
    _edit(plain_bundle, edit)
    _refused(plain_bundle, match)


# ---------------------------------------------------------------------------------------- strict JSON


@pytest.mark.parametrize("data, match", [
    (b"[" * 65 + b"]" * 65, r"x.json exceeds a JSON limit: it nests 65 levels deep, above the limit of 64\. HINT: fix"),
    (b"[" + b"0," * 262144 + b"0]", r"it has 262,145 containers, keys and values, above the limit of 262,144"),
    (b'["a",' + b'"",' * 400000 + b'""]', r"it has 1,200,007 quotes, brackets, commas and colons, above the limit of "
                                         r"1,048,576"),
    (b"]" * 100 + b"[", r"x.json is not valid JSON \(ValueError: its brackets do not balance: 1 opened, 100 closed"),
    ('{"a": 1}'.encode("utf-16"), r"x.json is not valid JSON \(UnicodeDecodeError"),
    (b'{"a": 1e999}', r"it holds the number 1e999, beyond float64"),
    (b'{"a": -Infinity}', r"it holds -Infinity, which JSON does not have"),
    (b'{"a": ' + b"9" * 101 + b"}", r"it holds a number literal of 101 characters"),
])
def test_strict_json_refuses_past_its_limits_naming_the_file(data, match):
    from nestflex.deploy.bundle.strict_json import parse_json

    with pytest.raises(BundleError, match=match):
        parse_json(data, "x.json", "fix it")


def test_strict_json_reads_text_brackets_and_the_deepest_allowed_document():
    from nestflex.deploy.bundle.strict_json import parse_json

    assert parse_json(b'{"a": "]]]}}}[[[", "b": [1, 2.5, null]}', "x.json", "") == {"a": "]]]}}}[[[", "b": [1, 2.5, None]}
    deep = parse_json(b"[" * 64 + b"]" * 64, "x.json", "")
    for _ in range(63):
        deep = deep[0]
    assert deep == []
    # brackets inside a string do not hide the real depth
    with pytest.raises(BundleError, match=r"it nests 65 levels deep"):
        parse_json(b'["' + b"]" * 10 + b'", ' + b"[" * 64 + b"]" * 64 + b"]", "x.json", "")


@pytest.mark.parametrize("make", [lambda n: b'"' + b"\\a" * (n // 2), lambda n: b'"\\"' * (n // 3),
                                  lambda n: b"]" * n, lambda n: b"[" + b"[]," * (n // 80) + b"[]]"],
                         ids=["escapes", "escaped_quotes", "closing_brackets", "many_arrays"])
def test_strict_json_is_linear_on_hostile_documents_up_to_the_size_cap(make):
    """The hostile documents at the size cap (16 MiB) against the same documents at 1/16 of it, timed
    in the same test: a linear scan takes ~16x as long (measured: ~0.2 s at the cap on a shared
    2-core machine), a quadratic one 256x. The bound is 10x the linear extrapolation of the small
    document's median, so a busy machine does not fail it; a quadratic scan does."""
    from nestflex.deploy.bundle.strict_json import parse_json

    def seconds(data):  # refused or (the small "many_arrays", under the count limit) parsed
        start = time.perf_counter()
        try:
            parse_json(data, "x.json", "")
        except BundleError:
            pass
        return time.perf_counter() - start

    big, small = make(16 << 20), make(1 << 20)
    small_s = sorted(seconds(small) for _ in range(5))[2]
    start = time.perf_counter()
    with pytest.raises(BundleError):  # at the cap every one of them is refused
        parse_json(big, "x.json", "")
    big_s = time.perf_counter() - start
    assert big_s <= 10 * 16 * max(small_s, 1e-3), (big_s, small_s)


@pytest.mark.parametrize("edit, match", [
    (lambda h, n: h[n].update(data_offsets=[h[n]["data_offsets"][0] + 4, h[n]["data_offsets"][1] + 4]),
     r"starts at byte \d+ of the data, expected \d+ \(a gap or an overlap\)|the tensors cover"),
    (lambda h, n: h[n].update(shape=[2**40] + h[n]["shape"][1:]), r"but data_offsets \[\d+, \d+\] span \d+ bytes"),
    (lambda h, n: h[n].update(dtype="F8"), r"has dtype 'F8' \(string\), not one of F64, I64"),
    (lambda h, n: h.update({"__metadata__": {"format": 1}}), r"`__metadata__` is not an object of strings"),
    (lambda h, n: h[n].pop("data_offsets"), r"needs a shape and data_offsets of non-negative ints, got"),
])
def test_a_safetensors_header_the_safetensors_reader_would_refuse_is_refused(plain_bundle, edit, match):
    from nestflex.deploy.bundle.safetensors_header import read_safetensors_header

    path = plain_bundle / "weights.safetensors"
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    edit(header, sorted(k for k in header if k != "__metadata__")[0])
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n :])
    with pytest.raises(BundleError, match=r"weights.safetensors' is not a safetensors file \(.*" + match):
        read_safetensors_header(path)
