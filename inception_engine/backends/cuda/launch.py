"""Plan -> launches, NCHW layout: ``LaunchSpec`` (one kernel launch as plain numbers; ``LaunchSpec.of`` takes its block
and dynamic shared memory from the kernel's registry entry, kernels.spec), ``launch_specs`` (the whole forward in plan
order: conv.cu / conv_tf32.cu / conv_f16.cu direct convs and their split-K reduction, winograd.cu's three launches,
pools, the FC, softmax) and ``Launch`` (a spec bound to its loaded kernel). The NHWC layout's launches are
launch_nhwc.py's; it reuses the FC and softmax ones from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...plan import ConvOp, FCOp, GlobalAvgPoolOp, Plan, PoolOp, View
from .cost_model import ConvConfig, config_shape
from .kernels import KernelSpec, conv_kernel_name, launch_async, spec, wino_kernel_names
from .params import transforms_key
from .tensor_maps import TensorMap
from .tiles import blocks
from .winograd import o_pad
from .workspace import counter_layout, workspace_layout


@dataclass(frozen=True)
class LaunchSpec:
    """One kernel launch: everything pycuda needs, as plain numbers."""

    op: str  # the plan op it belongs to (per-layer timing groups by this)
    kernel: str  # entry point in the cubins
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[int, ...]  # device pointers and int32s, in the kernel's parameter order
    shared: int = 0  # bytes of dynamic shared memory
    maps: tuple[TensorMap, ...] = ()  # tensor maps the kernel reads from its last argument's address on, 128 bytes each

    @classmethod
    def of(cls, op: str, kernel: KernelSpec, grid: tuple[int, int, int], args: tuple[int, ...],
           conv: ConvOp | None = None, maps: tuple[TensorMap, ...] = ()) -> LaunchSpec:
        """A launch of ``kernel`` with its registry entry's block and dynamic shared memory (that of the conv it
        computes, ``conv``, where that depends on the conv)."""
        return cls(op, kernel.name, grid, kernel.block, args, kernel.shared_bytes(conv), maps)


@dataclass(frozen=True)
class Launch:
    spec: LaunchSpec
    func: Any  # prepared pycuda Function

    def __call__(self, stream: Any) -> None:
        launch_async(self.func, self.spec.grid, self.spec.block, stream, *self.spec.args, shared=self.spec.shared)


def view_ptr(base: int, v: View) -> int:
    """Device address of element (0, 0, 0, 0) of the view."""
    return base + 4 * (v.offset + v.c_offset * v.h * v.w)


def batch_stride(v: View) -> int:
    return v.c_total * v.h * v.w


def conv_specs(name: str, src: View, dst: View, kernel: tuple[int, int], stride: int, pad: tuple[int, int],
               relu: bool, cfg: ConvConfig, arena: int, w: int, b: int, ws: int,
               counters: int | None = None) -> list[LaunchSpec]:
    """The implicit-GEMM launch when cfg.splits == 1. Split-K: one _fixup launch given tile counters (zeroed, see
    conv.cu) and a tile that has the variant, else the plain kernel into the workspace plus conv_splitk_reduce.
    w, b: weight/bias addresses."""
    n, cin, h, wd = src.dims
    _, cout, ho, wo = dst.dims
    n_total, t = n * ho * wo, cfg.tile
    split = cfg.splits > 1
    fixup = split and counters is not None and t.fixup
    y = view_ptr(arena, dst)
    args = (view_ptr(arena, src), w, b, ws if split and not fixup else y, n, cin, h, wd, batch_stride(src), cout, ho,
            wo, batch_stride(dst), stride, pad[0], pad[1], cfg.k_split, int(relu))
    gemm = LaunchSpec.of(name, spec(conv_kernel_name(kernel, t, fixup)),
                         (blocks(n_total, t.bn), blocks(cout, t.bm), cfg.splits),
                         args + ((ws, counters) if fixup else ()))
    if not split or fixup:
        return [gemm]
    k = spec("conv_splitk_reduce")
    reduce = LaunchSpec.of(name, k, (k.blocks(cout * n_total), 1, 1),
                           (ws, b, y, cfg.splits, cout, n_total, ho * wo, batch_stride(dst), int(relu)))
    return [gemm, reduce]


def winograd_specs(op: ConvOp, relu: bool, cfg: ConvConfig, arena: int, u: int, b: int, bt: int, at: int,
                   ws: int) -> list[LaunchSpec]:
    """The three launches of a Winograd conv (winograd.cu): V at ws, M (cfg.splits copies) right after it
    (``workspace_elems``). u, b: U (``winograd_weights``) and bias addresses; bt, at: the F(m, k) transforms
    (``winograd_transforms``)."""
    n, cin, h, w = op.src.dims
    _, cout, ho, wo = op.dst.dims
    shape = config_shape(op, cfg)
    v, m = ws, ws + 4 * shape.nn * cin * shape.t_pad
    opad = o_pad(cout, cfg.tile)
    k_in, k_gemm, k_out = (spec(k) for k in wino_kernel_names(op.kernel, cfg.wino, cfg.tile, cfg.splits))
    return [
        LaunchSpec.of(op.name, k_in, (k_in.blocks(cin * shape.t_total), 1, 1),
                      (view_ptr(arena, op.src), bt, v, n, cin, h, w, batch_stride(op.src), shape.tiles_h,
                       shape.tiles_w, shape.t_pad, op.pad[0], op.pad[1])),
        LaunchSpec.of(op.name, k_gemm, (shape.t_pad // cfg.tile.bn, opad // cfg.tile.bm, shape.nn * cfg.splits),
                      (u, v, m, cin, cout, opad, shape.t_pad, shape.nn, cfg.k_split)),
        LaunchSpec.of(op.name, k_out, (k_out.blocks(cout * shape.t_total), 1, 1),
                      (m, at, b, view_ptr(arena, op.dst), n, cout, ho, wo, batch_stride(op.dst), shape.tiles_h,
                       shape.tiles_w, shape.t_pad, cfg.splits, int(relu))),
    ]


def pool_spec(op: PoolOp, arena: int) -> LaunchSpec:
    n, c, h, w = op.src.dims
    _, _, ho, wo = op.dst.dims
    k = spec("pool2d")
    return LaunchSpec.of(op.name, k, (k.blocks(n * c * ho * wo), 1, 1),
                         (view_ptr(arena, op.src), view_ptr(arena, op.dst), n, c, h, w, batch_stride(op.src), ho, wo,
                          batch_stride(op.dst), op.kernel, op.stride, op.pad, int(op.kind == "max"),
                          int(op.count_include_pad)))


def gap_spec(op: GlobalAvgPoolOp, arena: int) -> LaunchSpec:
    n, c, h, w = op.src.dims
    k = spec("global_avg_pool")  # a warp a plane
    return LaunchSpec.of(op.name, k, (blocks(n * c, k.threads // 32), 1, 1),
                         (view_ptr(arena, op.src), view_ptr(arena, op.dst), n, c, h * w, batch_stride(op.src),
                          batch_stride(op.dst)))


def fc_specs(op: FCOp, cfg: ConvConfig | None, arena: int, w: int, b: int, ws: int,
             counters: int | None = None) -> list[LaunchSpec]:
    n, fin, _, _ = op.src.dims
    fout = op.dst.channels
    if cfg is None:
        k = spec("fc_gemv")  # a warp an output
        return [LaunchSpec.of(op.name, k, (blocks(fout, k.threads // 32), n, 1),
                              (view_ptr(arena, op.src), w, b, view_ptr(arena, op.dst), fin, fout,
                               batch_stride(op.src), batch_stride(op.dst)))]
    # A 1x1 convolution of a (N, in, 1, 1) image: M = out, N = batch, K = in; no ReLU on the logits.
    return conv_specs(op.name, op.src, op.dst, (1, 1), 1, (0, 0), False, cfg, arena, w, b, ws, counters)


def softmax_spec(logits: View, arena: int, probs: int) -> LaunchSpec:
    n, c = logits.n, logits.channels
    return LaunchSpec.of("softmax", spec("softmax_rows"), (n, 1, 1),
                         (view_ptr(arena, logits), probs, c, batch_stride(logits), c))


def launch_specs(plan: Plan, configs: dict[str, ConvConfig | None], arena: int, params: int,
                 offsets: dict[str, int], ws: int, probs: int | None = None,
                 counters: int | None = None) -> list[LaunchSpec]:
    """The whole forward as launches, in plan order. ws: the workspace of split-K and Winograd convs
    (``workspace_layout``'s size);
    probs: where softmax writes, None for logits only; counters: zeroed tile counters (``counter_layout``'s size)
    for split-K by _fixup kernels, None for conv_splitk_reduce."""
    specs: list[LaunchSpec] = []
    ws_offsets = workspace_layout(plan, configs)[1]
    counter_offsets = counter_layout(plan, configs)[1]
    for op in plan.ops:
        if isinstance(op, (ConvOp, FCOp)):
            w, b = params + 4 * offsets[op.name + ".weight"], params + 4 * offsets[op.name + ".bias"]
            ws_op = ws + 4 * ws_offsets.get(op.name, 0)
            cnt = None if counters is None else counters + 4 * counter_offsets.get(op.name, 0)
        if isinstance(op, ConvOp):
            cfg = configs[op.name]
            assert cfg is not None
            if cfg.wino:
                bt, at = (params + 4 * offsets[f"{transforms_key(op, cfg)}.{k}"] for k in ("bt", "at"))
                specs += winograd_specs(op, True, cfg, arena, w, b, bt, at, ws_op)
                continue
            specs += conv_specs(op.name, op.src, op.dst, op.kernel, op.stride, op.pad, True, cfg, arena, w, b, ws_op,
                                cnt)
        elif isinstance(op, PoolOp):
            specs.append(pool_spec(op, arena))
        elif isinstance(op, GlobalAvgPoolOp):
            specs.append(gap_spec(op, arena))
        elif isinstance(op, FCOp):
            specs += fc_specs(op, configs[op.name], arena, w, b, ws_op, cnt)
    if probs is not None:
        specs.append(softmax_spec(plan.output, arena, probs))
    return specs
