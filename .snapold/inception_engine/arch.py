"""Inception-V3 written as data.

The network is a list of layers in execution order. Each layer names the tensor(s) it reads; the tensor it
produces carries the layer's own name. Layer and branch names follow torchvision's ``inception_v3`` so that a
converted weight file, a torchvision state dict and this list line up key for key (``Mixed_6b.branch7x7_2``).

Where is Mixed_6b built? ``inception_v3()`` below calls ``inception_c("Mixed_6b", ...)``.

Shapes follow Szegedy et al., "Rethinking the Inception Architecture for Computer Vision" (2015), Fig. 5-7 and
Table 1, as implemented by torchvision: 94 convolutions (each Conv -> BatchNorm -> ReLU, BN folded into the conv
bias at conversion), 2 max pools in the stem, one pool branch per module, global average pool, fc 2048 -> 1000.
"""

from __future__ import annotations

from dataclasses import dataclass

INPUT = "image"  # name of the network's input tensor (N, 3, 299, 299)
INPUT_SIZE = 299
NUM_CLASSES = 1000


@dataclass(frozen=True)
class Network:
    """What tells the Inception-V3 variants apart, as data. ``torchvision``: the classifier (1000 ImageNet classes;
    average pools per the export's count_include_pad). ``fid``: the network FID is computed with, as pytorch-fid
    publishes it (pytorch_fid/inception.py: FIDInceptionA/C/E_1/E_2, ported from TF's 2015 graph): every pool
    branch's average pool excludes padding, Mixed_7c's pool branch (FIDInceptionE_2) takes a 3x3/1/pad-1 max pool,
    the classifier has 1008 outputs, and its input is [0, 1] pixels scaled to [-1, 1]."""

    name: str
    classes: int
    count_include_pad: bool | None  # None: as the weight file says
    last_pool: str  # Mixed_7c's pool branch: "avg" or "max"


NETWORKS = {"torchvision": Network("torchvision", NUM_CLASSES, None, "avg"),
            "fid": Network("fid", 1008, False, "max")}


@dataclass(frozen=True)
class Conv:
    """Convolution with bias and ReLU fused (BatchNorm already folded into weight and bias)."""

    name: str
    src: str
    in_ch: int
    out_ch: int
    kernel: tuple[int, int]
    stride: int = 1
    pad: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Pool:
    """3x3 max or average pool. ``count_include_pad`` only matters for average pools with padding."""

    name: str
    src: str
    kind: str  # "max" | "avg"
    kernel: int = 3
    stride: int = 1
    pad: int = 0
    count_include_pad: bool = True


@dataclass(frozen=True)
class Concat:
    """Channel concatenation, in order. Backends never copy: producers write at their channel offsets."""

    name: str
    srcs: tuple[str, ...]


@dataclass(frozen=True)
class GlobalAvgPool:
    name: str
    src: str


@dataclass(frozen=True)
class FC:
    name: str
    src: str
    in_features: int
    out_features: int


Layer = Conv | Pool | Concat | GlobalAvgPool | FC


def _conv(name: str, src: str, cin: int, cout: int, k: int | tuple[int, int], stride: int = 1,
          pad: int | tuple[int, int] = 0) -> Conv:
    kernel = (k, k) if isinstance(k, int) else k
    padding = (pad, pad) if isinstance(pad, int) else pad
    return Conv(name, src, cin, cout, kernel, stride, padding)


def inception_a(name: str, src: str, cin: int, pool_features: int, cip: bool) -> list[Layer]:
    """35x35 module: 1x1 | 1x1-5x5 | 1x1-3x3-3x3 | avgpool-1x1.  Out: 224 + pool_features channels."""
    n = name + "."
    return [
        _conv(n + "branch1x1", src, cin, 64, 1),
        _conv(n + "branch5x5_1", src, cin, 48, 1),
        _conv(n + "branch5x5_2", n + "branch5x5_1", 48, 64, 5, pad=2),
        _conv(n + "branch3x3dbl_1", src, cin, 64, 1),
        _conv(n + "branch3x3dbl_2", n + "branch3x3dbl_1", 64, 96, 3, pad=1),
        _conv(n + "branch3x3dbl_3", n + "branch3x3dbl_2", 96, 96, 3, pad=1),
        Pool(n + "avg_pool", src, "avg", 3, 1, 1, cip),
        _conv(n + "branch_pool", n + "avg_pool", cin, pool_features, 1),
        Concat(name, (n + "branch1x1", n + "branch5x5_2", n + "branch3x3dbl_3", n + "branch_pool")),
    ]


def inception_b(name: str, src: str, cin: int) -> list[Layer]:
    """Grid reduction 35 -> 17: 3x3/2 | 1x1-3x3-3x3/2 | maxpool/2.  Out: 480 + cin channels."""
    n = name + "."
    return [
        _conv(n + "branch3x3", src, cin, 384, 3, stride=2),
        _conv(n + "branch3x3dbl_1", src, cin, 64, 1),
        _conv(n + "branch3x3dbl_2", n + "branch3x3dbl_1", 64, 96, 3, pad=1),
        _conv(n + "branch3x3dbl_3", n + "branch3x3dbl_2", 96, 96, 3, stride=2),
        Pool(n + "max_pool", src, "max", 3, 2, 0),
        Concat(name, (n + "branch3x3", n + "branch3x3dbl_3", n + "max_pool")),
    ]


def inception_c(name: str, src: str, cin: int, c7: int, cip: bool) -> list[Layer]:
    """17x17 module with factorised 7x7 (1x7 then 7x1).  Out: 768 channels."""
    n = name + "."
    return [
        _conv(n + "branch1x1", src, cin, 192, 1),
        _conv(n + "branch7x7_1", src, cin, c7, 1),
        _conv(n + "branch7x7_2", n + "branch7x7_1", c7, c7, (1, 7), pad=(0, 3)),
        _conv(n + "branch7x7_3", n + "branch7x7_2", c7, 192, (7, 1), pad=(3, 0)),
        _conv(n + "branch7x7dbl_1", src, cin, c7, 1),
        _conv(n + "branch7x7dbl_2", n + "branch7x7dbl_1", c7, c7, (7, 1), pad=(3, 0)),
        _conv(n + "branch7x7dbl_3", n + "branch7x7dbl_2", c7, c7, (1, 7), pad=(0, 3)),
        _conv(n + "branch7x7dbl_4", n + "branch7x7dbl_3", c7, c7, (7, 1), pad=(3, 0)),
        _conv(n + "branch7x7dbl_5", n + "branch7x7dbl_4", c7, 192, (1, 7), pad=(0, 3)),
        Pool(n + "avg_pool", src, "avg", 3, 1, 1, cip),
        _conv(n + "branch_pool", n + "avg_pool", cin, 192, 1),
        Concat(name, (n + "branch1x1", n + "branch7x7_3", n + "branch7x7dbl_5", n + "branch_pool")),
    ]


def inception_d(name: str, src: str, cin: int) -> list[Layer]:
    """Grid reduction 17 -> 8: 1x1-3x3/2 | 1x1-1x7-7x1-3x3/2 | maxpool/2.  Out: 512 + cin channels."""
    n = name + "."
    return [
        _conv(n + "branch3x3_1", src, cin, 192, 1),
        _conv(n + "branch3x3_2", n + "branch3x3_1", 192, 320, 3, stride=2),
        _conv(n + "branch7x7x3_1", src, cin, 192, 1),
        _conv(n + "branch7x7x3_2", n + "branch7x7x3_1", 192, 192, (1, 7), pad=(0, 3)),
        _conv(n + "branch7x7x3_3", n + "branch7x7x3_2", 192, 192, (7, 1), pad=(3, 0)),
        _conv(n + "branch7x7x3_4", n + "branch7x7x3_3", 192, 192, 3, stride=2),
        Pool(n + "max_pool", src, "max", 3, 2, 0),
        Concat(name, (n + "branch3x3_2", n + "branch7x7x3_4", n + "max_pool")),
    ]


def inception_e(name: str, src: str, cin: int, cip: bool, pool: str = "avg") -> list[Layer]:
    """8x8 module with expanded filter banks (1x3 and 3x1 side by side).  Out: 2048 channels.

    torchvision concatenates the 1x3/3x1 pairs first and then the four branches; channel order is the same as
    one flat concat of six tensors, which is what is written here. ``pool``: the pool branch's 3x3/1/pad-1 pool
    ("max" in the FID network's Mixed_7c).
    """
    n = name + "."
    pooled = n + f"{pool}_pool"
    return [
        _conv(n + "branch1x1", src, cin, 320, 1),
        _conv(n + "branch3x3_1", src, cin, 384, 1),
        _conv(n + "branch3x3_2a", n + "branch3x3_1", 384, 384, (1, 3), pad=(0, 1)),
        _conv(n + "branch3x3_2b", n + "branch3x3_1", 384, 384, (3, 1), pad=(1, 0)),
        _conv(n + "branch3x3dbl_1", src, cin, 448, 1),
        _conv(n + "branch3x3dbl_2", n + "branch3x3dbl_1", 448, 384, 3, pad=1),
        _conv(n + "branch3x3dbl_3a", n + "branch3x3dbl_2", 384, 384, (1, 3), pad=(0, 1)),
        _conv(n + "branch3x3dbl_3b", n + "branch3x3dbl_2", 384, 384, (3, 1), pad=(1, 0)),
        Pool(pooled, src, pool, 3, 1, 1, cip),
        _conv(n + "branch_pool", pooled, cin, 192, 1),
        Concat(name, (n + "branch1x1", n + "branch3x3_2a", n + "branch3x3_2b",
                      n + "branch3x3dbl_3a", n + "branch3x3dbl_3b", n + "branch_pool")),
    ]


def inception_v3(count_include_pad: bool = True, network: str = "torchvision") -> list[Layer]:
    """The whole network, input ``image`` (N, 3, 299, 299) to logits ``fc`` (N, classes); ``network``: a key of
    NETWORKS (the FID network fixes its own count_include_pad)."""
    net = NETWORKS[network]
    cip = count_include_pad if net.count_include_pad is None else net.count_include_pad
    return [
        _conv("Conv2d_1a_3x3", INPUT, 3, 32, 3, stride=2),
        _conv("Conv2d_2a_3x3", "Conv2d_1a_3x3", 32, 32, 3),
        _conv("Conv2d_2b_3x3", "Conv2d_2a_3x3", 32, 64, 3, pad=1),
        Pool("maxpool1", "Conv2d_2b_3x3", "max", 3, 2, 0),
        _conv("Conv2d_3b_1x1", "maxpool1", 64, 80, 1),
        _conv("Conv2d_4a_3x3", "Conv2d_3b_1x1", 80, 192, 3),
        Pool("maxpool2", "Conv2d_4a_3x3", "max", 3, 2, 0),
        *inception_a("Mixed_5b", "maxpool2", 192, 32, cip),
        *inception_a("Mixed_5c", "Mixed_5b", 256, 64, cip),
        *inception_a("Mixed_5d", "Mixed_5c", 288, 64, cip),
        *inception_b("Mixed_6a", "Mixed_5d", 288),
        *inception_c("Mixed_6b", "Mixed_6a", 768, 128, cip),
        *inception_c("Mixed_6c", "Mixed_6b", 768, 160, cip),
        *inception_c("Mixed_6d", "Mixed_6c", 768, 160, cip),
        *inception_c("Mixed_6e", "Mixed_6d", 768, 192, cip),
        *inception_d("Mixed_7a", "Mixed_6e", 768),
        *inception_e("Mixed_7b", "Mixed_7a", 1280, cip),
        *inception_e("Mixed_7c", "Mixed_7b", 2048, cip, net.last_pool),
        GlobalAvgPool("avgpool", "Mixed_7c"),
        FC("fc", "avgpool", 2048, net.classes),
    ]


def conv_layers(layers: list[Layer] | None = None) -> list[Conv]:
    return [l for l in (layers or inception_v3()) if isinstance(l, Conv)]


def weight_shapes(layers: list[Layer] | None = None) -> dict[str, tuple[int, ...]]:
    """Canonical weight-file keys and shapes: ``<layer>.weight`` (O, C, kh, kw) and ``<layer>.bias`` (O,)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for l in layers or inception_v3():
        if isinstance(l, Conv):
            shapes[l.name + ".weight"] = (l.out_ch, l.in_ch, *l.kernel)
            shapes[l.name + ".bias"] = (l.out_ch,)
        elif isinstance(l, FC):
            shapes[l.name + ".weight"] = (l.out_features, l.in_features)
            shapes[l.name + ".bias"] = (l.out_features,)
    return shapes
