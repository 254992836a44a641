"""Invariant 6 with a bundle: where torch, the training packages and onnx cannot be imported, the
device side loads a bundle and runs every level, both exit sets (SDN and FlexDNN's, batched and
one frame at a time) and a split, numpy in and out, with the answers of the torch reference."""

import json

import numpy as np

import nestflex.deploy as nd
from tests.deploy.blocked import run_blocked
from tests.export.bundles import write_flex_bundle


def test_load_and_run_a_bundle_without_torch_or_the_training_packages(tmp_path):
    info, *_ = write_flex_bundle(tmp_path, onnx=False)  # SDN exits and FlexDNN's (index_select) exits
    bundle = nd.load(info["bundle"])
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32), dtype=np.float32) * 3
    # the torch reference, here where torch is: the eager interpreter of the bundle's program
    want = {f"level_{k}": nd.CapacityRuntime(bundle, k, plan="eager")(x) for k in range(bundle.num_levels)}
    for key in ("exits", "flex_exits"):
        ref = nd.ProgressiveRuntime(bundle, exit_set=key, plan="eager")
        for j, z in enumerate(ref.all_exits(x)):
            want[f"{key}.exit_{j}"] = z
        got = ref(x)
        want[f"{key}.logits"], want[f"{key}.exit_index"] = got.logits, got.exit_index
    split = bundle.splits[0]["name"]
    np.save(tmp_path / "x.npy", x)
    out = run_blocked(f"""
        import json, warnings
        import numpy as np
        import nestflex.deploy as nd

        x = np.load({str(tmp_path / "x.npy")!r})
        got = {{}}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            b = nd.load({info["bundle"]!r})
            rt = nd.CapacityRuntime(b, level=0)
            for k in [0, 2, 1]:
                rt.set_level(k)
                got[f"level_{{k}}"] = rt(x)
            rt.set_level(b.num_levels - 1)
            for key in ("exits", "flex_exits"):
                prog = nd.ProgressiveRuntime(b, rt, exit_set=key)
                for j, z in enumerate(prog.all_exits(x)):
                    got[f"{{key}}.exit_{{j}}"] = z
                batch = prog(x)
                got[f"{{key}}.logits"], got[f"{{key}}.exit_index"] = batch.logits, batch.exit_index
                one = [prog(x[i:i + 1]) for i in range(x.shape[0])]  # one frame at a time
                got[f"{{key}}.one.logits"] = np.concatenate([r.logits for r in one])
                got[f"{{key}}.one.exit_index"] = np.concatenate([r.exit_index for r in one])
            head, tail = rt.split({split!r})
            got["split"] = tail(*head(x))
        np.savez({str(tmp_path / "got.npz")!r}, **got)
        print(json.dumps({{"attempts": ATTEMPTS, "loaded": loaded(), "numpy": all(isinstance(v, np.ndarray) for v in
                          got.values()), "warnings": [str(w.message) for w in caught]}}))
    """)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    # torch and the training packages are never even tried; onnx only by the builder of the optional
    # fused early-exit graph, which says so and leaves single frames to run stage by stage
    assert set(report["attempts"]) == {"onnx"} and report["loaded"] == []
    for key in ("exits", "flex_exits"):  # a fresh bundle: each set tried to build its graph once
        assert any(w.startswith(f"{key} of ") and "no fused early-exit graph (onnx is not installed)" in w
                   and "nestflex[tune]" in w for w in report["warnings"]), report["warnings"]
    assert report["numpy"]
    got = np.load(tmp_path / "got.npz")
    for k in range(bundle.num_levels):
        np.testing.assert_allclose(got[f"level_{k}"], want[f"level_{k}"], atol=1e-4, rtol=0, err_msg=f"level {k}")
    for key in ("exits", "flex_exits"):
        for j in range(len(bundle.exit_sets[key]["names"])):
            np.testing.assert_allclose(got[f"{key}.exit_{j}"], want[f"{key}.exit_{j}"], atol=1e-4, rtol=0)
        for mode in ("", "one."):
            np.testing.assert_array_equal(got[f"{key}.{mode}exit_index"], want[f"{key}.exit_index"], err_msg=key + mode)
            np.testing.assert_allclose(got[f"{key}.{mode}logits"], want[f"{key}.logits"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(got["split"], want[f"level_{bundle.num_levels - 1}"], atol=1e-4, rtol=0)
