"""The GPU kernels: their source, their launches, and Metal on a CPU.

``source`` composes ``kernels/`` (one body an algorithm over ``common.h``) into the Metal or
CUDA text MLX compiles, and fingerprints it; ``tuning`` holds the launches' group sizes and
the hardware limits; ``matrices`` a weight matrix as kernel inputs. ``contract`` is the launch
contract a caller builds (``TailLaunch``: weights, fold plan, norm, eps); ``run`` is the one
door every launch goes through to its backend (``metal``, ``cuda``, ``metal-emulated``),
eager or inside a model's graph. Behind it: ``launch`` (a tail's three launches prepared),
``one_launch`` and ``one_launch_shape`` (the CUDA tail as one launch, and its shape),
``next_norm``, ``head`` (Q/K/V), ``gdn_step`` (a Gated DeltaNet step), ``emulated`` and
``metal_emulation`` with ``metal_translation``, ``metal_toolchain`` and ``metal_memory``
(Metal compiled by clang and run on the CPU); ``metal_drop_in`` is ``metal_kernel``, a drop-in
for ``mx.fast.metal_kernel`` running a user's Metal there; ``output_coverage`` a launch's outputs
filled before it (NaN, then a sentinel) and an element it never wrote named. The names below are the part's API,
importable from ``workbench.kernels``; each module is imported when one of its names is first read.
"""

from workbench import public_names

_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        "contract": ("TailLaunch", "check_launch", "check_tail_inputs", "each_row"),
        "matrices": ("DENSE_GS", "units_for", "interleaved"),
        "cuda_device": ("multiprocessor_count",),
        "output_coverage": ("covered_launch", "never_written", "UncoveredOutput", "mlx_launch", "torch_launch"),
        "run": (
            "METAL_EMULATED",
            "DEVICE_BACKENDS",
            "KERNEL_BACKENDS",
            "check_backend",
            "is_emulated",
            "compiled_kernel",
            "source_kernel",
            "run_tail",
            "lazy_tail",
            "run_kernel_tail",
            "run_cuda_tail",
        ),
        "source": (
            "KERNELS",
            "DIALECTS",
            "TAIL_KERNELS",
            "ONE_LAUNCH_BODY",
            "ONE_LAUNCH_PHASES",
            "compose",
            "fingerprint",
            "mlx_name",
            "input_dtypes",
            "one_launch_inputs",
            "cuda_translation_unit",
            "one_launch_translation_unit",
        ),
        "tuning": ("KernelTuning", "DEFAULT_TUNING", "checked_tuning"),
        "launch": ("PreparedTail", "prepare_tail", "prepared", "settle_constants"),
        "one_launch": (
            "OneLaunchTail",
            "GridBarrierTimeout",
            "CHOICE_MARGIN",
            "BARRIER_LIMIT_MS",
            "SANITIZER_BARRIER_LIMIT_MS",
            "for_launch",
            "fits",
        ),
        "one_launch_shape": (
            "OneLaunchShape",
            "shape_for",
            "shape_for_formats",
            "DEFAULT_NT",
            "FOUR_BIT_NT",
            "FOUR_BIT_ROW_UNITS",
        ),
        "next_norm": ("NextNorm",),
        "head": ("head_launch", "head_refusals"),
        "gdn_step": ("GdnShape", "GdnStep", "recurrent_step_exact"),
        "emulated": ("metal_tail_source", "emulated_tail"),
        "metal_emulation": ("SCHEDULES", "DEFAULT_ORDER", "DEFAULT_SCHEDULES", "MATH_MODES", "EmulatedKernel"),
        "metal_memory": ("buffers_mapped",),
        "metal_drop_in": ("metal_kernel", "GridWarning"),
    },
)

__all__ = list(_HOMES)
