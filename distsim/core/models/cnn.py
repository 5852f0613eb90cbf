"""Convolutional workloads (VGG, ResNet-50, Inception-v3): chains and branching DAGs, no tensor parallelism.

Architectures follow the papers as implemented in torchvision, so that parameter counts can be checked
against its published figures: VGG-16/19 are configurations D and E of Simonyan & Zisserman 2015 ("Very
Deep Convolutional Networks for Large-Scale Image Recognition", Table 1); ResNet-50 is the 50-layer network
of He et al. 2016 ("Deep Residual Learning for Image Recognition", Table 1) in its v1.5 form (stride 2 on the
3x3 conv of a bottleneck); Inception-v3 is Szegedy et al. 2016 ("Rethinking the Inception Architecture for
Computer Vision", Table 1 and Figs. 5-7) with torchvision's exact layer dimensions, without the auxiliary
classifier.

Cost conventions, per sample (one image), with ``e`` = activation bytes:

* A conv (with its BN and ReLU fused into one layer) or a linear layer does ``2 x MACs`` forward FLOPs, with
  ``MACs = H_out W_out C_in C_out k_h k_w`` (conv) or ``in x out`` (linear). Element-wise work (bias, BN,
  ReLU, residual add) adds no FLOPs: it is bandwidth-bound, and ``io_bytes`` carries it.
* A pooling op does one FLOP per window element (``k_h k_w`` per output element); an adaptive average pool
  one per input element (or per output element when it upsamples). A concat does no FLOPs (data movement).
* Parameters are weights + biases; BN adds its ``2 C`` affine parameters (running statistics are buffers).
* Every block lists its kernels (``Block.ops``) for the analytic cost model, and ``io_bytes`` is their bytes: a
  conv is an implicit GEMM (Chetlur et al. 2014, Sec. 3: M = H_out W_out per sample, N = C_out, K = C_in k_h k_w)
  reading its input feature map and writing its output, then its bias add (a separate kernel in cuDNN's path),
  training-mode batch norm (statistics pass and normalise pass: the output read twice and written once) and ReLU
  (read and write); a pool, a linear layer and a concat are one kernel reading its input and writing its output.
  ``out_bytes`` = ``e x output elements``.
* ``saved_bytes``: a conv or linear layer keeps its input and one output-sized tensor (the BN input / ReLU
  output); a pool keeps its input; a concat keeps nothing. Fan-out makes this an over-estimate: each consumer
  of an Inception module's input counts that tensor again (the layers may land on different pipeline stages).
* A ResNet bottleneck is one layer whose costs add its three convs, BNs, ReLUs, the residual add and the
  downsample projection (see :meth:`_Builder.bottleneck`).

No layer has a Megatron split (every block is ``tp="none"``), so these models need tensor-parallel degree 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from distsim.core.errors import ModelFileError
from distsim.core.models.graph import FP16_MIXED, Block, Layer, Model, Precision
from distsim.core.models.ops import GemmOp, MemoryOp, Op

Pair = int | tuple[int, int]


def _pair(value: Pair) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else value


def _tensors(*elements: int) -> tuple[tuple[int, bool], ...]:
    """``Block.tensors`` of a layer's parameter tensors in the torch module's registration order (weight, then bias;
    a BatchNorm's weight and bias after its conv). Nothing here is tensor-parallel (``tp="none"``), so the split flag
    only says that no part of them is replicated (``replicated_params`` is 0)."""
    return tuple((n, True) for n in elements)


def _out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    """Output length of a conv/pool along one axis (PyTorch's floor mode)."""
    return (size + 2 * pad - kernel) // stride + 1


class _Builder:
    """Appends layers in topological order, tracking each layer's output (channels, square spatial size)."""

    def __init__(self, model: str, precision: Precision, image: int, channels: int = 3) -> None:
        self.model = model
        self.e = precision.act_bytes
        self.layers: list[Layer] = []
        self.out: dict[str, tuple[int, int]] = {}
        self.image = (channels, image)

    @property
    def last(self) -> str:
        return self.layers[-1].name

    @property
    def hw(self) -> int:
        return self.out[self.last][1] if self.layers else self.image[1]

    def _source(self, src: str | None) -> tuple[int, int, tuple[str, ...] | None]:
        """(channels, spatial size, Layer.inputs) of an input; None: the previous layer (or the image)."""
        if src is None or (self.layers and src == self.last):
            c, hw = self.out[self.last] if self.layers else self.image
            return c, hw, None
        c, hw = self.out[src]
        return c, hw, (src,)

    def _spatial(self, name: str, hw: int, k: Pair, stride: int, pad: Pair) -> int:
        (kh, kw), (ph, pw) = _pair(k), _pair(pad)
        out_h, out_w = _out_size(hw, kh, stride, ph), _out_size(hw, kw, stride, pw)
        if min(out_h, out_w) < 1:
            raise ModelFileError(f"{self.model}: the input image is too small (layer {name!r} gets {hw}x{hw})")
        if out_h != out_w:
            raise ValueError(f"{self.model}: layer {name!r} makes a non-square {out_h}x{out_w} feature map")
        return out_h

    def _add(
        self,
        name: str,
        block: Block,
        inputs: tuple[str, ...] | None,
        out: tuple[int, int],
        saved_elems: int,
    ) -> str:
        c, hw = out
        self.layers.append(
            Layer(
                name=name,
                blocks=(block,),
                out_bytes=float(c * hw * hw * self.e),
                saved_bytes=float(saved_elems * self.e),
                inputs=inputs,
            )
        )
        self.out[name] = out
        return name

    def conv(
        self,
        name: str,
        cout: int,
        k: Pair,
        stride: int = 1,
        pad: Pair = 0,
        src: str | None = None,
        bias: bool = False,
        bn: bool = True,
    ) -> str:
        """Conv2d (+ BatchNorm) + ReLU as one layer."""
        cin, hw, inputs = self._source(src)
        kh, kw = _pair(k)
        out_hw = self._spatial(name, hw, k, stride, pad)
        in_elems, out_elems = cin * hw * hw, cout * out_hw * out_hw
        ops = self._conv_ops("conv", cin, cout, kh * kw, hw, out_hw, bias=bias and not bn, bn=bn, relu=True)
        block = Block(
            op="conv2d",
            shape=(
                ("cin", cin),
                ("cout", cout),
                ("kh", kh),
                ("kw", kw),
                ("stride", stride),
                ("hw", hw),
                ("out_hw", out_hw),
                ("bn", int(bn)),
            ),
            params=cin * cout * kh * kw + (cout if bias else 0) + (2 * cout if bn else 0),
            ops=ops,
            tensors=_tensors(cin * cout * kh * kw, *([cout] if bias else []), *([cout, cout] if bn else [])),
        )
        return self._add(name, block, inputs, (cout, out_hw), in_elems + out_elems)

    def _conv_ops(
        self, name: str, cin: int, cout: int, window: int, hw: int, out_hw: int, bias: bool, bn: bool, relu: bool
    ) -> tuple[Op, ...]:
        """A convolution as an implicit GEMM plus its bias, batch-norm and ReLU kernels (per sample)."""
        e, out = self.e, cout * out_hw * out_hw
        ops: list[Op] = [GemmOp(name, out_hw * out_hw, cout, cin * window, "none", e, in_elems=cin * hw * hw)]
        if bias:
            ops.append(MemoryOp(f"{name}.bias", float(2 * out * e)))
        if bn:
            ops.append(MemoryOp(f"{name}.bn", float(3 * out * e), reduction=True))
        if relu:
            ops.append(MemoryOp(f"{name}.relu", float(2 * out * e)))
        return tuple(ops)

    def pool(self, name: str, op: str, k: int, stride: int, pad: int = 0, src: str | None = None) -> str:
        """Max or average pooling (op ``maxpool`` / ``avgpool``) with a square window."""
        c, hw, inputs = self._source(src)
        out_hw = self._spatial(name, hw, k, stride, pad)
        in_elems, out_elems = c * hw * hw, c * out_hw * out_hw
        io = float((in_elems + out_elems) * self.e)
        block = Block(
            op=op,
            shape=(("c", c), ("k", k), ("stride", stride), ("hw", hw), ("out_hw", out_hw)),
            ops=(MemoryOp(op, io, flops=float(out_elems * k * k)),),
        )
        return self._add(name, block, inputs, (c, out_hw), in_elems)

    def adaptive_avgpool(self, name: str, out_hw: int, src: str | None = None) -> str:
        """Average pooling to a fixed output size (torchvision's AdaptiveAvgPool2d; out_hw=1: global pool)."""
        c, hw, inputs = self._source(src)
        in_elems, out_elems = c * hw * hw, c * out_hw * out_hw
        io = float((in_elems + out_elems) * self.e)
        block = Block(
            op="avgpool",
            shape=(("c", c), ("hw", hw), ("out_hw", out_hw)),
            ops=(MemoryOp("avgpool", io, flops=float(max(in_elems, out_elems))),),
        )
        return self._add(name, block, inputs, (c, out_hw), in_elems)

    def linear(self, name: str, cout: int, src: str | None = None) -> str:
        """Fully-connected layer (with bias) on the flattened input; ReLU/dropout around it are folded in."""
        c, hw, inputs = self._source(src)
        cin = c * hw * hw
        block = Block(
            op="linear",
            shape=(("in", cin), ("out", cout)),
            params=cin * cout + cout,
            ops=(GemmOp("linear", 1, cout, cin, "none", self.e),),  # bias added in the GEMM's epilogue (addmm)
            tensors=_tensors(cin * cout, cout),
        )
        return self._add(name, block, inputs, (cout, 1), cin + cout)

    def concat(self, name: str, srcs: tuple[str, ...]) -> str:
        """Channel concatenation of branch outputs (the join of an Inception module)."""
        sizes = {self.out[s][1] for s in srcs}
        if len(sizes) != 1:
            raise ValueError(f"{self.model}: concat {name!r} joins feature maps of sizes {sorted(sizes)}")
        hw = sizes.pop()
        c = sum(self.out[s][0] for s in srcs)
        elems = c * hw * hw
        block = Block(
            op="concat",
            shape=(("c", c), ("hw", hw), ("branches", len(srcs))),
            ops=(MemoryOp("concat", float(2 * elems * self.e)),),
        )
        return self._add(name, block, srcs, (c, hw), 0)

    def bottleneck(self, name: str, width: int, stride: int, src: str | None = None) -> str:
        """ResNet v1.5 bottleneck (1x1, 3x3 with the stride, 1x1 to 4 x width; BN after each) as one layer.

        The downsample projection (1x1 conv with the stride + BN) is present when the stride or the channel
        count changes. The ops are torchvision's kernels: conv, BN, ReLU for the first two convs; conv, BN for the
        third and the projection; the residual add (two reads, one write) and the last ReLU. saved_bytes keeps the
        block input, the BN input and ReLU output of the first two convs, the BN input of the third (and of the
        projection) and the block output.
        """
        cin, hw, inputs = self._source(src)
        cout = 4 * width
        out_hw = self._spatial(name, hw, 3, stride, 1)
        down = stride != 1 or cin != cout
        x, a1, a2, y = cin * hw * hw, width * hw * hw, width * out_hw * out_hw, cout * out_hw * out_hw
        params = cin * width + 9 * width * width + width * cout + 2 * (2 * width + cout)
        params += (cin * cout + 2 * cout) if down else 0
        # conv1, bn1, conv2, bn2, conv3, bn3, then the projection's conv and BN, as torchvision registers them
        tensors = _tensors(cin * width, width, width, 9 * width * width, width, width, width * cout, cout, cout,
                           *((cin * cout, cout, cout) if down else ()))  # fmt: skip
        saved = x + 2 * a1 + 2 * a2 + 2 * y + (y if down else 0)
        ops = (
            *self._conv_ops("conv1", cin, width, 1, hw, hw, bias=False, bn=True, relu=True),
            *self._conv_ops("conv2", width, width, 9, hw, out_hw, bias=False, bn=True, relu=True),
            *self._conv_ops("conv3", width, cout, 1, out_hw, out_hw, bias=False, bn=True, relu=False),
            *(self._conv_ops("downsample", cin, cout, 1, hw, out_hw, False, True, False) if down else ()),
            MemoryOp("residual_add", float(3 * y * self.e)),
            MemoryOp("relu", float(2 * y * self.e)),
        )
        block = Block(
            op="bottleneck",
            shape=(
                ("cin", cin),
                ("width", width),
                ("cout", cout),
                ("stride", stride),
                ("hw", hw),
                ("downsample", int(down)),
            ),
            params=params,
            ops=ops,
            tensors=tensors,
        )
        return self._add(name, block, inputs, (cout, out_hw), saved)

    def build(self, source: str, description: str, precision: Precision) -> Model:
        return Model(
            name=self.model,
            layers=tuple(self.layers),
            seq_len=None,
            tp_constraints=(),
            precision=precision,
            source=source,
            description=description,
        )


# -------------------------------------------------------------------------------------------------------- VGG
_VGG_WIDTHS = (64, 128, 256, 512, 512)
_VGG_CONVS = {"vgg16": (2, 2, 3, 3, 3), "vgg19": (2, 2, 4, 4, 4)}


def _vgg(name: str, config: str, precision: Precision, image: int, classes: int) -> Model:
    b = _Builder(name, precision, image)
    for stage, (convs, width) in enumerate(zip(_VGG_CONVS[name], _VGG_WIDTHS, strict=True), start=1):
        for i in range(1, convs + 1):
            b.conv(f"conv{stage}_{i}", width, 3, pad=1, bias=True, bn=False)
        b.pool(f"pool{stage}", "maxpool", 2, 2)
    # torchvision's AdaptiveAvgPool2d((7, 7)) is the identity at 224x224, so it is left out there
    if b.hw != 7:
        b.adaptive_avgpool("avgpool", 7)
    for fc, width in (("fc6", 4096), ("fc7", 4096), ("fc8", classes)):
        b.linear(fc, width)
    convs = sum(_VGG_CONVS[name])
    return b.build(
        source=f"Simonyan & Zisserman 2015, Table 1 (configuration {config}); torchvision {name}",
        description=f"{convs} conv + 5 maxpool + 3 fc layers, {image}x{image} input, {classes} classes",
        precision=precision,
    )


def vgg16(precision: Precision = FP16_MIXED, image: int = 224, classes: int = 1000) -> Model:
    """VGG-16 (configuration D): 13 3x3 convs with bias, 5 max-pools, 3 fully-connected layers."""
    return _vgg("vgg16", "D", precision, image, classes)


def vgg19(precision: Precision = FP16_MIXED, image: int = 224, classes: int = 1000) -> Model:
    """VGG-19 (configuration E): 16 3x3 convs with bias, 5 max-pools, 3 fully-connected layers."""
    return _vgg("vgg19", "E", precision, image, classes)


# -------------------------------------------------------------------------------------------------- ResNet-50
_RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
"""(bottleneck width, blocks, stride of the first block) of conv2_x .. conv5_x (He et al. 2016, Table 1)."""


def resnet50(precision: Precision = FP16_MIXED, image: int = 224, classes: int = 1000) -> Model:
    """ResNet-50 v1.5: 7x7 stem conv, max-pool, 16 bottleneck layers, global average pool, fc."""
    b = _Builder("resnet50", precision, image)
    b.conv("conv1", 64, 7, stride=2, pad=3)
    b.pool("maxpool", "maxpool", 3, 2, pad=1)
    for stage, (width, blocks, stride) in enumerate(_RESNET50_STAGES, start=1):
        for i in range(blocks):
            b.bottleneck(f"layer{stage}.{i}", width, stride if i == 0 else 1)
    b.adaptive_avgpool("avgpool", 1)
    b.linear("fc", classes)
    return b.build(
        source="He et al. 2016, Table 1 (50-layer); v1.5 bottleneck (stride on the 3x3 conv), as torchvision",
        description=f"stem + 16 bottlenecks + fc ({len(b.layers)} layers), {image}x{image} input",
        precision=precision,
    )


# ----------------------------------------------------------------------------------------------- Inception-v3
@dataclass(frozen=True)
class _Conv:
    """A BasicConv2d of an Inception branch (conv without bias + BN + ReLU)."""

    name: str
    cout: int
    k: Pair
    stride: int = 1
    pad: Pair = 0

    def add(self, b: _Builder, name: str, src: str) -> str:
        return b.conv(name, self.cout, self.k, self.stride, self.pad, src=src)


@dataclass(frozen=True)
class _Pool:
    """The pooling op that opens an Inception pool branch."""

    name: str
    op: str
    k: int
    stride: int
    pad: int = 0

    def add(self, b: _Builder, name: str, src: str) -> str:
        return b.pool(name, self.op, self.k, self.stride, self.pad, src=src)


_Paths = tuple[tuple[_Conv | _Pool, ...], ...]
"""An Inception module: paths from the module input to the concatenated output; shared prefixes built once."""


def _inception_a(pool_features: int) -> _Paths:
    """InceptionA (Mixed_5b/5c/5d, Szegedy et al. Fig. 5): 35x35; a 5x5 path and a double-3x3 path."""
    return (
        (_Conv("branch1x1", 64, 1),),
        (_Conv("branch5x5_1", 48, 1), _Conv("branch5x5_2", 64, 5, pad=2)),
        (
            _Conv("branch3x3dbl_1", 64, 1),
            _Conv("branch3x3dbl_2", 96, 3, pad=1),
            _Conv("branch3x3dbl_3", 96, 3, pad=1),
        ),
        (_Pool("avg_pool", "avgpool", 3, 1, 1), _Conv("branch_pool", pool_features, 1)),
    )


_INCEPTION_B: _Paths = (  # Mixed_6a: grid reduction 35 -> 17
    (_Conv("branch3x3", 384, 3, stride=2),),
    (
        _Conv("branch3x3dbl_1", 64, 1),
        _Conv("branch3x3dbl_2", 96, 3, pad=1),
        _Conv("branch3x3dbl_3", 96, 3, stride=2),
    ),
    (_Pool("max_pool", "maxpool", 3, 2),),
)


def _inception_c(c7: int) -> _Paths:
    """InceptionC (Mixed_6b..6e, Szegedy et al. Fig. 6): 17x17, 7x7 factorised into 1x7 and 7x1."""
    row, col = {"k": (1, 7), "pad": (0, 3)}, {"k": (7, 1), "pad": (3, 0)}
    return (
        (_Conv("branch1x1", 192, 1),),
        (_Conv("branch7x7_1", c7, 1), _Conv("branch7x7_2", c7, **row), _Conv("branch7x7_3", 192, **col)),
        (
            _Conv("branch7x7dbl_1", c7, 1),
            _Conv("branch7x7dbl_2", c7, **col),
            _Conv("branch7x7dbl_3", c7, **row),
            _Conv("branch7x7dbl_4", c7, **col),
            _Conv("branch7x7dbl_5", 192, **row),
        ),
        (_Pool("avg_pool", "avgpool", 3, 1, 1), _Conv("branch_pool", 192, 1)),
    )


_INCEPTION_D: _Paths = (  # Mixed_7a: grid reduction 17 -> 8
    (_Conv("branch3x3_1", 192, 1), _Conv("branch3x3_2", 320, 3, stride=2)),
    (
        _Conv("branch7x7x3_1", 192, 1),
        _Conv("branch7x7x3_2", 192, (1, 7), pad=(0, 3)),
        _Conv("branch7x7x3_3", 192, (7, 1), pad=(3, 0)),
        _Conv("branch7x7x3_4", 192, 3, stride=2),
    ),
    (_Pool("max_pool", "maxpool", 3, 2),),
)

_E3, _E_DBL1, _E_DBL2 = (
    _Conv("branch3x3_1", 384, 1),
    _Conv("branch3x3dbl_1", 448, 1),
    _Conv("branch3x3dbl_2", 384, 3, pad=1),
)
# Mixed_7b/7c (Szegedy et al. Fig. 7): 8x8; the 3x3 outputs split into parallel 1x3 and 3x1 convs
_INCEPTION_E: _Paths = (
    (_Conv("branch1x1", 320, 1),),
    (_E3, _Conv("branch3x3_2a", 384, (1, 3), pad=(0, 1))),
    (_E3, _Conv("branch3x3_2b", 384, (3, 1), pad=(1, 0))),
    (_E_DBL1, _E_DBL2, _Conv("branch3x3dbl_3a", 384, (1, 3), pad=(0, 1))),
    (_E_DBL1, _E_DBL2, _Conv("branch3x3dbl_3b", 384, (3, 1), pad=(1, 0))),
    (_Pool("avg_pool", "avgpool", 3, 1, 1), _Conv("branch_pool", 192, 1)),
)

_INCEPTION_V3_MIXED: tuple[tuple[str, _Paths], ...] = (
    ("Mixed_5b", _inception_a(32)),
    ("Mixed_5c", _inception_a(64)),
    ("Mixed_5d", _inception_a(64)),
    ("Mixed_6a", _INCEPTION_B),
    ("Mixed_6b", _inception_c(128)),
    ("Mixed_6c", _inception_c(160)),
    ("Mixed_6d", _inception_c(160)),
    ("Mixed_6e", _inception_c(192)),
    ("Mixed_7a", _INCEPTION_D),
    ("Mixed_7b", _INCEPTION_E),
    ("Mixed_7c", _INCEPTION_E),
)


def _mixed(b: _Builder, module: str, paths: _Paths) -> str:
    """One Inception module, branch by branch from the current layer, then the concat of the branch ends."""
    start, ends = b.last, []
    for path in paths:
        src = start
        for op in path:
            name = f"{module}.{op.name}"
            src = name if name in b.out else op.add(b, name, src)
        ends.append(src)
    return b.concat(f"{module}.concat", tuple(ends))


def inception_v3(precision: Precision = FP16_MIXED, image: int = 299, classes: int = 1000) -> Model:
    """Inception-v3 as torchvision's ``inception_v3`` without AuxLogits (dropout is folded into fc)."""
    b = _Builder("inception-v3", precision, image)
    b.conv("Conv2d_1a_3x3", 32, 3, stride=2)
    b.conv("Conv2d_2a_3x3", 32, 3)
    b.conv("Conv2d_2b_3x3", 64, 3, pad=1)
    b.pool("maxpool1", "maxpool", 3, 2)
    b.conv("Conv2d_3b_1x1", 80, 1)
    b.conv("Conv2d_4a_3x3", 192, 3)
    b.pool("maxpool2", "maxpool", 3, 2)
    for module, paths in _INCEPTION_V3_MIXED:
        _mixed(b, module, paths)
    b.adaptive_avgpool("avgpool", 1)
    b.linear("fc", classes)
    return b.build(
        source="Szegedy et al. 2016, Table 1 and Figs. 5-7; dimensions of torchvision inception_v3 (no aux)",
        description=f"stem + 11 Inception modules + fc ({len(b.layers)} layers, DAG), {image}x{image} input",
        precision=precision,
    )
