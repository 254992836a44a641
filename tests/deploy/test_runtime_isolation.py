"""Invariant 6 with a bundle: load and run one where the training packages cannot be imported."""

import subprocess
import sys
import textwrap

from tests.export.bundles import write_flex_bundle

BLOCKED = ("lightning", "pytorch_lightning", "timm", "torchmetrics", "onnx")


def test_load_and_run_a_bundle_without_the_training_packages(tmp_path):
    info, *_ = write_flex_bundle(tmp_path, onnx=False)  # SDN exits and FlexDNN's (index_select) exits
    code = textwrap.dedent(f"""
        import sys
        BLOCKED = {BLOCKED!r}

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is blocked: the train extra is not installed")
                return None

        sys.meta_path.insert(0, Block())
        import torch
        import nestflex.deploy as nd
        b = nd.load({info["bundle"]!r})
        rt = nd.CapacityRuntime(b, level=0)
        report = rt.set_level(b.num_levels - 1)
        out = nd.ProgressiveRuntime(b, rt)(torch.randn(4, 3, 32, 32))
        flex = nd.ProgressiveRuntime(b, rt, exit_set="flex_exits")(torch.randn(3, 3, 32, 32))
        print(report.page_in_bytes > 0, tuple(rt(torch.randn(2, 3, 32, 32)).shape), tuple(out.logits.shape),
              tuple(flex.logits.shape))
        print(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True (2, 10) (4, 10) (3, 10)", "[]"]
