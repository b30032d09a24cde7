"""The CUDA backend: the whole Inception-V3 forward on the GPU with the engine's own kernels (cuda_src/), via pycuda.

Set-up does everything once: compile (or load cached) cubins, pick a kernel variant and launch shape for every op
(the cost model, or measured tuning), upload the weights in the layout the kernels read, allocate one arena for all
activations (the plan's offsets), the split-K workspace and pinned host buffers, and turn the plan into a list of
prepared launches. A forward is then: copy the input in, replay the launches (one CUDA graph, or one
``prepared_async_call`` each), copy the logits out. Nothing is allocated, compiled or synchronised in between.

Precisions and layouts. "tf32" (TF32 products, fp32 sums, ~1e-3 from float64) and "fp16" keep the activations
channels innermost (NHWC), as TF32 values in float32 words or as fp16: every conv is conv_nhwc_*.cu's implicit GEMM,
whose operands are whole 16-byte pieces loaded by cp.async (on sm_90a its wgmma tiles, elsewhere mma.sync), except the
first, which reads the 3-channel float32 input as uploaded (conv_input_nhwc.cu); the pools are pool_nhwc.cu's, and
the FC runs on float32 features. ``CudaBackend(nhwc=False)`` runs them on fp32 NCHW tensors instead (conv_tf32.cu /
conv_f16.cu, the Winograd convs FFMA). "fp32" keeps float32's accuracy (~1e-6): on sm_90a it takes the NHWC path
too, each conv product three fp16 ones on the tensor cores ("3xFP16", conv_mma.cuh's NhwcF32); elsewhere, or with
nhwc=False, it runs on NCHW tensors: conv.cu's FFMA kernels, and winograd.cu's F(2x2, 3x3), F(4x4, 3x3), F(2x2, 5x5)
or F(3, 7) for the stride-1 3x3, 5x5, 1x7 and 7x1 convs.

Where things are (each module's docstring says more):

    tiles.py        the tile catalogue: every kernel tile, its model speed, its shared memory, what fits where
    cost_model.py   ConvConfig and choose_configs: each conv's tile, split-K and Winograd-or-not by the model
    winograd.py     Winograd set-up: eligible convs, tile shapes, U and the transforms
    tuning.py       measured tuning's candidates, pick and cache (the timing itself: backend.tune_configs)
    params.py       weights and biases packed in the kernels' layouts
    workspace.py    split-K / Winograd workspace and tile counters
    families/       the kernel families, one module each: its sources, C signatures, registry entries, launches
    kernels.py      the kernel registry (the families' entries); Kernels loads them
    launch.py       plan -> LaunchSpecs on NCHW (launch_specs); Launch binds one to its kernel
    launch_nhwc.py  plan -> LaunchSpecs on NHWC (nhwc_launch_specs), the layout's checks and side buffer
    lowering.py     lower: plan, configs and GPU facts -> LaunchSpecs over named buffers (pure; the backend's input)
    tensor_maps.py  the TMA tiles' tensor maps: what each describes, and its bytes (the driver's or the emulator's)
    schedule.py     which stream each op runs on and what it waits for
    device.py       pycuda: driver, probe, Gpu
    backend.py      CudaBackend, and tune_configs / time_convs that time candidates with it
    selftest.py     python -m inception_engine.backends.cuda --selftest (one forward vs float64)

The input side (GPU JPEG decoding: inception_engine/ingest) and the streaming pipeline's GPU end
(inception_engine/cuda_runner.py) live outside the backends: no module here imports them.

The planning half (tiles to launch specs) is plain Python and needs no GPU; pycuda is imported only when a backend is
built. The package re-exports every module's public names, so ``from inception_engine.backends import cuda`` and
``cuda.choose_configs``, ``cuda.CudaBackend`` work as well as importing from the module that defines them.
"""

from __future__ import annotations

from .tiles import (F16_TILES, F32_WGMMA_SHAPES, HALF_NAN_BITS, TMA_ROW, HALO_CIN, HALO_SPEEDS, HALO_THREADS,
                    INPUT_MAX_K, INPUT_MMA_MAX_K, INPUT_MMA_PRECISIONS, INPUT_MMA_TILE, INPUT_TILE, KERNEL_SIZES,
                    MAX_SHARED_BYTES, MAXPOOL_KERNEL, MAXPOOL_PREFIXES, NAN_BITS, NHWC_ELEMS, NHWC_F32_WGMMA_TILES,
                    NHWC_PIECE, NHWC_TF32_TILES, NHWC_TF32_WGMMA_TILES, NHWC_TILES, NHWC_WGMMA_TILES, NhwcElem,
                    PRECISIONS, TF32_TILES, THREADS, Tile, TILES, TILES_OF, WGMMA_LO_TILES, WGMMA_PREFIX,
                    WGMMA_SLOWDOWN, WGMMA_SPEEDS, WINO_TILES, WS_SPEEDS, WS_THREADS, blocks, check_nhwc_precision,
                    conv_kernel, folds_max_pools, halo_conv_smem_bytes, halo_fits, halo_smem_bytes, halo_tile,
                    input_mma_blocks, input_mma_smem_bytes, input_tile, is_halo, is_tma, is_ws, tile_fits, tile_label,
                    wgmma_ring_bytes, wgmma_stages, wgmma_tile, WS_PP_SHAPES, WS_PP_THREADS, WS_TMA_SHAPES,
                    is_pingpong, ws_pp_tile, ws_stages, ws_row, ws_tile, ws_tma_tile)
from .tensor_maps import MAP_BYTES, Im2colMap, TensorMap, TiledMap, emulated, encode, encode_all
from .winograd import (WINO_MIN_BATCH, WINO_T_ALIGN, WINO_VARIANTS, WinogradShape, axis_matrices, o_pad,
                       winograd_eligible, winograd_shape, winograd_tile, winograd_transforms, winograd_weights)
from .cost_model import (ConvConfig, FIXUP_FIXED_US, FIXUP_SLICE_US, HBM_BYTES_PER_US, LAUNCH_US, MAX_SPLITS,
                         MIN_K_SPLIT, REDUCE_BYTES_PER_US, REDUCE_FIXED_US, WAVE_OVERHEAD_US, WINO_MARGIN,
                         choose_configs, config_shape, conv_config, uses_gemv, winograd_config)
from .tuning import (config_from_json, config_to_json, pick_fastest, tuning_cache_dir, tuning_candidates,
                     tuning_key)
from .params import direct_weights, op_params, pack_params, round_tf32, transforms_key
from .workspace import counter_layout, workspace_elems, workspace_layout
from .kernels import (CONV_FORMAT, FIXUP_FORMAT, REGISTRY, SHARED_WITHOUT_OPT_IN, TOPK_THREADS, WINO_GEMM_FORMAT,
                      WINO_INPUT_FORMAT, WINO_OUTPUT_FORMAT, ConvShared, KernelSpec, Kernels, NHWC_CONV_FORMAT,
                      NHWC_TMA_FORMAT, Signature, all_kernel_names, arg_format, conv_kernel_name, entries,
                      nhwc_conv_source, signature, source_of, spec, tile_shared, unit_of, wino_kernel_names)
from .launch import (Launch, LaunchSpec, batch_stride, conv_specs, fc_specs, gap_spec, launch_specs, pool_spec,
                     softmax_spec, view_ptr, winograd_specs)
from .launch_nhwc import (NhwcSide, check_nhwc, nhwc_conv_specs, nhwc_fits, nhwc_launch_specs, nhwc_parts,
                          nhwc_pool_spec, nhwc_ptr, nhwc_side, tma_map_layout, tma_maps)
from .lowering import GpuFacts, Lowering, Ref, lower, resolve_spec
from .schedule import Scheduled, depends, schedule
from .device import Gpu, driver, probe
from .backend import CudaBackend, time_convs, tune_configs
from .selftest import SELFTEST_TOL, he_weights, rel_l2, selftest, top1_agree, top5_agree
