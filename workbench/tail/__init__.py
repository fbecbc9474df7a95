"""The attention layer's tail: its weights, its math, and the three ways to run it.

``weights`` holds one layer's :class:`TailWeights` and the recipe random cases follow; ``ops``
the math, once in numpy and once in MLX; ``paths`` the oracle (:func:`host_tail`), the engine
before the fusion (:func:`unfused_tail`, two waits) and the fused tail (:func:`fused_tail`, one
wait) on any backend; ``comparison`` the criterion and every error metric; ``frink_case``
frink-models' test case, bit for bit; ``faults`` the tail's one fault vocabulary (the check's
fault models, the sweeps' mutations, the three-way comparison's faulty variants);
``pack_weights`` a Hadamard pack's layer as tail weights (every linear with its own input
rotation). The names below are the tail's API, importable from ``workbench.tail`` itself; each
module is imported when one of its names is first read. ``TailLaunch`` is the kernels' launch
contract (``workbench.kernels``), which the tail builds.
"""

from workbench import public_names

_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        "weights": (
            "DEFAULT_EPS",
            "NORM_CONVENTIONS",
            "Draw",
            "TailRefused",
            "TailWeights",
            "case_recipe",
            "random_inputs",
        ),
        "ops": ("rms_norm_np", "silu_np", "tail_np", "tail_mx"),
        "paths": (
            "TailLaunch",
            "check_inputs",
            "fused_tail",
            "host_tail",
            "tail_graph",
            "tail_launch",
            "tail_refusals",
            "to_mx",
            "unfused_tail",
        ),
        "comparison": (
            "Comparison",
            "compare",
            "scaled_error",
            "worst_scaled_error",
            "max_abs_error",
            "max_rel_error",
            "nmse",
            "torch_ratio",
            "ulp_distance",
            "TORCH_DEFAULTS",
        ),
        "pack_weights": ("pack_tail_weights",),
        "faults": ("TAIL_FAULTS", "TailFault", "TailVariant", "apply_fault", "fault_docs"),
        "frink_case": ("SEED_TOL", "SEED_SHAPE", "SEED_EPS", "SeedArrays", "SeedCase", "seed_arrays", "seed_case"),
    },
)

__all__ = list(_HOMES)
