"""Gradient buckets: the zoo's parameter tensors are the executor's, and DDP's bucket assignment is PyTorch's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from distsim.models import get_model  # noqa: E402
from distsim.models.cnn import _Builder  # noqa: E402
from distsim.models.graph import FP32, Model  # noqa: E402
from distsim.profiler.blocks import build_block  # noqa: E402


def small_cnn() -> Model:
    """Every CNN block kind the zoo builds: a conv with bias and no BN (VGG), convs with BN, max and average pools,
    a branching concat, bottlenecks with and without the projection, the adaptive pool and the classifier."""
    b = _Builder("small-cnn", FP32, 16)
    b.conv("conv_bias", 8, 3, pad=1, bias=True, bn=False)
    b.conv("conv_bn", 16, 3, pad=1)
    b.pool("maxpool", "maxpool", 2, 2)
    left = b.conv("left", 8, 1, src="maxpool")
    right = b.pool("right", "avgpool", 3, 1, 1, src="maxpool")
    b.concat("concat", (left, right))
    b.bottleneck("down", 8, 2)
    b.bottleneck("same", 8, 1)
    b.adaptive_avgpool("avgpool", 1)
    b.linear("fc", 10)
    return b.build("test", "every CNN block kind", FP32)


@pytest.mark.parametrize("spec", ["gpt2-cpu", "bert-cpu", "t5-cpu", "resnet50:image=32,classes=10", "small-cnn"])
def test_block_tensors_are_the_torch_modules_parameters(spec: str) -> None:
    """``Block.tensors`` lists the module's ``parameters()`` in order, and what one tp rank of 2 holds of each."""
    model = small_cnn() if spec == "small-cnn" else get_model(spec)
    checked = 0
    for layer in model.layers:
        for block in layer.blocks:
            assert sum(n for n, _ in block.tensors) == block.params, (layer.name, block.op)
            for tp in (1, 2) if block.tp == "shard" else (1,):
                for rank in range(tp):
                    module = build_block(block, tp, rank, device="meta")  # shapes only
                    got = tuple(float(p.numel()) for p in module.parameters())
                    assert got == block.shard_tensors(tp), (layer.name, block.op, tp, rank)
                    checked += 1
    assert checked >= len(model.layers)
