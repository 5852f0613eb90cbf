"""CNN workloads against torchvision's published parameter counts and GMACs, and their graph structure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import networkx as nx
import pytest

from distsim.core.errors import ModelFileError
from distsim.core.models.cnn import inception_v3, resnet50, vgg16, vgg19
from distsim.core.models.graph import FP16_MIXED, FP32, Layer, Model

BUILDERS: dict[str, Callable[..., Model]] = {
    "vgg16": vgg16,
    "vgg19": vgg19,
    "resnet50": resnet50,
    "inception-v3": inception_v3,
}

# torchvision's model documentation: params and "GFLOPS" (which are GMACs of convs and linears)
AUX_PARAMS = (768 * 128 + 2 * 128) + (128 * 768 * 5 * 5 + 2 * 768) + (768 * 1000 + 1000)
REFERENCE = {  # name: (params, GMACs)
    "vgg16": (138_357_544, 15.47),
    "vgg19": (143_667_240, 19.63),
    "resnet50": (25_557_032, 4.09),
    "inception-v3": (27_161_264 - AUX_PARAMS, 5.71),
}
MAC_OPS = ("conv2d", "linear", "bottleneck")


def macs(model: Model) -> float:
    return sum(layer.fwd_flops for layer in model.layers if layer.blocks[0].op in MAC_OPS) / 2


def layer(model: Model, name: str) -> Layer:
    return next(x for x in model.layers if x.name == name)


def index(model: Model, name: str) -> int:
    return next(i for i, x in enumerate(model.layers) if x.name == name)


def test_aux_head_params_match_torchvision_difference() -> None:
    # InceptionAux: conv0 1x1 768->128 + BN, conv1 5x5 128->768 + BN, fc 768->1000 with bias
    assert AUX_PARAMS == 3_326_696
    assert REFERENCE["inception-v3"][0] == 23_834_568


@pytest.mark.parametrize("name", list(BUILDERS))
def test_params_match_torchvision_exactly(name: str) -> None:
    assert BUILDERS[name]().params == REFERENCE[name][0]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_macs_match_torchvision(name: str) -> None:
    model = BUILDERS[name]()
    ref_gmacs = REFERENCE[name][1]
    # the reference is rounded to 0.01 GMACs: conv + linear MACs agree to well within 0.5 %
    assert macs(model) / 1e9 == pytest.approx(ref_gmacs, rel=0.005)
    # pooling adds a little on top of 2 x MACs
    assert model.fwd_flops_per_sample == pytest.approx(2e9 * ref_gmacs, rel=0.02)
    assert model.fwd_flops_per_sample >= 2 * macs(model)


def test_single_layer_costs_by_hand() -> None:
    v = vgg16()
    conv = layer(v, "conv1_1")
    assert conv.params == 3 * 64 * 9 + 64
    assert conv.fwd_flops == 2 * 224 * 224 * 3 * 64 * 9
    assert conv.out_bytes == 64 * 224 * 224 * 2
    assert conv.saved_bytes == (3 + 64) * 224 * 224 * 2
    # io_bytes sums the layer's kernels: the implicit GEMM reads the input and writes the output, then the bias add
    # and the ReLU each read and write the output
    assert conv.blocks[0].io_bytes == (3 + 64) * 224 * 224 * 2 + 2 * (2 * 64 * 224 * 224 * 2)
    assert [op.name for op in conv.blocks[0].ops] == ["conv", "conv.bias", "conv.relu"]
    pool = layer(v, "pool1")
    assert pool.params == 0
    assert pool.out_bytes == 64 * 112 * 112 * 2
    assert pool.saved_bytes == 64 * 224 * 224 * 2
    assert pool.blocks[0].io_bytes == 64 * (224 * 224 + 112 * 112) * 2
    fc6 = layer(v, "fc6")
    assert fc6.params == 512 * 7 * 7 * 4096 + 4096
    assert fc6.fwd_flops == 2 * 25088 * 4096

    r = resnet50()
    # layer1.0: 1x1 64->64, 3x3 64->64, 1x1 64->256, downsample 1x1 64->256, BN on each
    first = layer(r, "layer1.0")
    assert first.params == 64 * 64 + 9 * 64 * 64 + 64 * 256 + 64 * 256 + 2 * (64 + 64 + 256 + 256)
    assert first.fwd_flops == 2 * 56 * 56 * (64 * 64 + 9 * 64 * 64 + 64 * 256 + 64 * 256)
    # layer2.0: v1.5 puts the stride on the 3x3 conv, so the first 1x1 runs at 56x56
    down = layer(r, "layer2.0")
    assert down.fwd_flops == 2 * (56 * 56 * 256 * 128 + 28 * 28 * (9 * 128 * 128 + 128 * 512 + 256 * 512))
    assert dict(down.blocks[0].shape)["downsample"] == 1
    assert dict(layer(r, "layer2.1").blocks[0].shape)["downsample"] == 0
    assert down.out_bytes == 512 * 28 * 28 * 2

    i = inception_v3()
    conv5 = layer(i, "Mixed_5b.branch5x5_2")
    assert conv5.params == 48 * 64 * 25 + 2 * 64  # no bias, BN affine
    assert conv5.fwd_flops == 2 * 35 * 35 * 48 * 64 * 25
    row = layer(i, "Mixed_6b.branch7x7_2")
    assert dict(row.blocks[0].shape) == {
        "cin": 128,
        "cout": 128,
        "kh": 1,
        "kw": 7,
        "stride": 1,
        "hw": 17,
        "out_hw": 17,
        "bn": 1,
    }
    assert layer(i, "Mixed_5b.concat").saved_bytes == 0


def test_layer_counts() -> None:
    def ops(model: Model) -> Counter[str]:
        return Counter(x.blocks[0].op for x in model.layers)

    v16, v19, r50, inc = vgg16(), vgg19(), resnet50(), inception_v3()
    assert v16.num_layers == 21
    assert ops(v16) == {"conv2d": 13, "maxpool": 5, "linear": 3}
    assert v19.num_layers == 24
    assert ops(v19) == {"conv2d": 16, "maxpool": 5, "linear": 3}
    assert r50.num_layers == 20
    assert ops(r50) == {"conv2d": 1, "maxpool": 1, "bottleneck": 16, "avgpool": 1, "linear": 1}
    # stem 5 convs + 2 pools; modules A 3x9, B 6, C 4x12, D 8, E 2x11; avgpool + fc
    assert inc.num_layers == 7 + 27 + 6 + 48 + 8 + 22 + 2 == 120
    assert ops(inc) == {"conv2d": 94, "concat": 11, "avgpool": 10, "maxpool": 4, "linear": 1}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_model_conventions(name: str) -> None:
    model = BUILDERS[name]()
    assert model.name == name
    assert model.seq_len is None
    assert model.tp_constraints == ()
    assert model.source and model.description
    for x in model.layers:
        assert len(x.blocks) == 1
        block = x.blocks[0]
        assert block.tp == "none"
        assert block.tp_fwd_allreduce_bytes == block.tp_bwd_allreduce_bytes == 0
        assert x.saved_sharded_bytes == 0
        assert x.out_bytes > 0
        assert block.io_bytes > 0


@pytest.mark.parametrize("name", list(BUILDERS))
def test_same_shape_same_cost(name: str) -> None:
    seen: dict[tuple[str, tuple[tuple[str, int], ...]], tuple[float, int, float, float, float]] = {}
    for x in BUILDERS[name]().layers:
        b = x.blocks[0]
        cost = (b.fwd_flops, b.params, b.io_bytes, x.out_bytes, x.saved_bytes)
        assert seen.setdefault((b.op, b.shape), cost) == cost


@pytest.mark.parametrize("name", list(BUILDERS))
def test_precision_scales_bytes_only(name: str) -> None:
    half, full = BUILDERS[name](FP16_MIXED), BUILDERS[name](FP32)
    assert full.precision is FP32
    assert full.params == half.params
    assert full.fwd_flops_per_sample == half.fwd_flops_per_sample
    for a, b in zip(half.layers, full.layers, strict=True):
        assert b.out_bytes == 2 * a.out_bytes
        assert b.saved_bytes == 2 * a.saved_bytes
        assert b.blocks[0].io_bytes == 2 * a.blocks[0].io_bytes


@pytest.mark.parametrize("name", ["vgg16", "vgg19", "resnet50"])
def test_chains_are_chains(name: str) -> None:
    model = BUILDERS[name]()
    assert model.is_chain
    assert all(x.inputs is None for x in model.layers)
    assert nx.is_directed_acyclic_graph(model.graph)
    # in a chain the boundary after layer p carries exactly that layer's output
    assert model.boundary_bytes == tuple(x.out_bytes for x in model.layers[:-1])


def test_inception_is_a_dag_not_a_chain() -> None:
    model = inception_v3()
    assert not model.is_chain
    assert nx.is_directed_acyclic_graph(model.graph)
    assert nx.is_weakly_connected(model.graph)
    # one source (the stem) and one sink (fc): every branch ends in a concat
    assert [n for n, d in model.graph.in_degree() if d == 0] == [0]
    assert [n for n, d in model.graph.out_degree() if d == 0] == [model.num_layers - 1]
    # InceptionE concatenates the split 1x3/3x1 outputs directly: 6 inputs, 2048 channels of 8x8
    concat = layer(model, "Mixed_7b.concat")
    assert concat.inputs == tuple(
        f"Mixed_7b.{b}"
        for b in (
            "branch1x1",
            "branch3x3_2a",
            "branch3x3_2b",
            "branch3x3dbl_3a",
            "branch3x3dbl_3b",
            "branch_pool",
        )
    )
    assert layer(model, "Mixed_7b.branch3x3_2b").inputs == ("Mixed_7b.branch3x3_1",)
    channels = {"Mixed_5b": 256, "Mixed_5c": 288, "Mixed_5d": 288, "Mixed_6a": 768, "Mixed_6e": 768}
    channels |= {"Mixed_7a": 1280, "Mixed_7b": 2048, "Mixed_7c": 2048}
    sizes = {"5": 35, "6": 17, "7": 8}
    for module, c in channels.items():
        hw = sizes[module[6]]
        assert layer(model, f"{module}.concat").out_bytes == c * hw * hw * 2


def test_inception_boundary_counts_live_branches() -> None:
    model = inception_v3()
    e = 2
    # cut after Mixed_5b.branch5x5_1: the module input (maxpool2, 192x35x35) is still needed by the 3x3dbl and
    # pool branches, branch1x1 (64 ch) waits for the concat, branch5x5_1 (48 ch) feeds branch5x5_2
    cut = index(model, "Mixed_5b.branch5x5_1")
    assert model.boundary_bytes[cut] == (192 + 64 + 48) * 35 * 35 * e == 744_800
    # cut after Mixed_7b.branch3x3_2a: module input (1280 ch), branch1x1 (320), branch3x3_1 (384, still needed
    # by 2b) and branch3x3_2a (384), all 8x8
    cut = index(model, "Mixed_7b.branch3x3_2a")
    assert model.boundary_bytes[cut] == (1280 + 320 + 384 + 384) * 8 * 8 * e == 303_104
    # cut after a concat: only the module output is live
    cut = index(model, "Mixed_6a.concat")
    assert model.boundary_bytes[cut] == 768 * 17 * 17 * e


@pytest.mark.parametrize("name", list(BUILDERS))
def test_tensor_parallelism_is_refused(name: str) -> None:
    model = BUILDERS[name]()
    assert model.tp_problem(1) is None
    message = model.tp_problem(2)
    assert message is not None
    assert "tp must be 1" in message


def test_other_image_sizes() -> None:
    # torchvision's AdaptiveAvgPool2d((7, 7)) keeps VGG's fc6 at 25088 inputs for any image size
    big = vgg16(image=256)
    assert big.num_layers == 22
    assert layer(big, "avgpool").out_bytes == 512 * 7 * 7 * 2
    assert big.params == REFERENCE["vgg16"][0]
    assert vgg19(classes=10).params == REFERENCE["vgg19"][0] - 4096 * 990 - 990
    assert resnet50(image=32).params == REFERENCE["resnet50"][0]
    assert inception_v3(image=75).num_layers == 120  # torchvision's smallest accepted input
    for build, image in ((vgg16, 16), (inception_v3, 74)):
        with pytest.raises(ModelFileError, match="too small"):
            build(image=image)
