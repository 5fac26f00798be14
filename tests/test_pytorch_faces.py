"""``rawconv.ops``, ``rawconv.fused`` and ``rawconv.torch_choice`` (``rawconv/pytorch/{ops,fused,
torch_choice}.py``) hand on the names of their parts (``ops_kernels``, ``ops_autograd``,
``ops_functions``, ``ops_forms``; ``fused_plans``, ``fused_graph``, ``fused_frozen``;
``torch_choice_flags``, ``torch_choice_cpu``, ``torch_choice_cuda``). A hook or setting a test sets on
a face (``monkeypatch.setattr(ops, "_cuda_last", rec)``, ``rawconv.fused.CAPTURE_LEGACY_RESIDUAL =
False``) must reach the part that reads it, and no other part may hold a binding of its own. CPU only."""
from __future__ import annotations


import pytest
import torch

import rawconv.fused as fused
import rawconv.ops as ops
import rawconv.torch_choice as tc
from conftest import face_routing_tests

PARTS = {face: tuple(f"rawconv.pytorch.{p}" for p in parts) for face, parts in (
    (ops, ("ops_kernels", "ops_autograd", "ops_functions", "ops_forms")),
    (fused, ("fused_plans", "fused_graph", "fused_frozen")),
    (tc, ("torch_choice_flags", "torch_choice_cpu", "torch_choice_cuda")))}



(test_a_name_set_on_the_face_is_set_in_the_part_that_reads_it,
 test_no_other_part_holds_its_own_binding_of_a_setting) = face_routing_tests(PARTS)


def test_the_direct_path_reads_the_checked_forward_patched_on_the_face(monkeypatch):
    """The operator's CUDA kernel (called directly, with CPU tensors its checks would refuse) takes
    its checked path through the ``_forward_cuda_checked`` patched on the face."""
    seen = []

    def spy(*a):
        seen.append(a[8])
        raise RuntimeError("spied")
    monkeypatch.setattr(ops, "_forward_cuda_checked", spy)
    x, w = torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3)
    with pytest.raises(RuntimeError, match="spied"):
        ops._forward_cuda(x, w, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, "cudnn", "", "strict", "", "")
    assert seen == ["cudnn"]


def test_moved_classes_keep_the_faces_module():
    """Pickles and the API reference name the classes on the face, as before the split."""
    for cls in (ops.TrainingChoice, ops.RawconvConvForward, ops.RawconvConvTranspose):
        assert cls.__module__ == "rawconv.pytorch.ops", cls
    for cls in (fused._PlanDict, fused._FrozenState):
        assert cls.__module__ == "rawconv.pytorch.fused", cls
    for cls in (tc.TorchFlags, tc.OneDNNRun, tc.CandidateKernels, tc.TorchChoice):
        assert cls.__module__ == "rawconv.pytorch.torch_choice", cls
    assert callable(tc)   # rawconv.torch_choice is the module, and calling it calls torch_choice
