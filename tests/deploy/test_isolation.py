"""Invariant 6 at import time: importing the device side (``nestflex.deploy`` and every part of it,
``nestflex.cli``) loads no torch and no training dependency, and does not even try to."""

from tests.deploy.blocked import run_blocked

# gRPC and Ray are installed here, but belong to the split client's first TailClient and nestflex.serve
LAZY = ("grpc", "ray")


def test_importing_the_device_side_tries_no_torch_and_no_training_dependency():
    out = run_blocked(f"""
        import nestflex.deploy, nestflex.cli, nestflex.deploy.engine, nestflex.deploy.tune, nestflex.deploy.backends
        import nestflex.deploy.backends.quantize, nestflex.deploy.backends.padding, nestflex.deploy.backends.fused_exits
        import nestflex.deploy.backends.op_profile, nestflex._machine
        print(ATTEMPTS)
        print(loaded(BLOCKED + {LAZY!r}))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "[]"], f"importing the device side tried or loaded: {out.stdout}"


def test_the_machine_record_names_onnxruntime_and_no_torch_when_torch_is_not_loaded():
    out = run_blocked("""
        from nestflex._machine import machine
        m = machine()
        print(m["onnxruntime"] is not None, "CPUExecutionProvider" in m["onnxruntime_providers"],
              m["torch"], m["torch_threads"], m["cuda"], ATTEMPTS)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "None", "None", "None", "[]"]


def test_the_machine_record_reports_torch_once_it_is_loaded():
    import torch

    from nestflex._machine import machine

    m = machine(note="here")
    assert (m["torch"], m["torch_threads"], m["note"]) == (torch.__version__, torch.get_num_threads(), "here")
