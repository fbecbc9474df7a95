"""A hybrid model's decode step, run stage by stage of the plan.

``geometry``: a hybrid's widths; ``state``: its random weights and what a decode keeps
between tokens; ``layers``: the Gated DeltaNet step and the attention as lazy ops;
``schedule``: one token executed as a stage of the plan, checked and timed; ``savings``:
measured savings against the wait table's and the price model's; ``matvec``: the step's
matrix products as MLX ops or through the project's kernels.

The names below are the part's API, importable from ``workbench.decode`` itself; each module
is imported when one of its names is first read.
"""

from workbench import public_names

_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        "geometry": ("Geometry", "CPU_GEOMETRY", "geometry_of"),
        "state": ("HybridWeights", "DecodeState", "MAX_TOKENS", "new_state", "check_state"),
        "layers": (
            "recurrent_layer",
            "recurrent_step",
            "gated_delta_ops",
            "attend_mx",
            "attend_np",
            "fast_gdn_available",
        ),
        "schedule": ("Schedule", "CHECK_TOL", "check_step", "in_token_probes"),
        "savings": (
            "MEASURED_SPLITS",
            "compare_savings",
            "fit_price",
            "in_token_prices",
            "check_rows",
            "percentile_interval",
            "resampled_medians",
        ),
        "matvec": (
            "MlxMatvecs",
            "KernelMatvecs",
            "make_matvecs",
            "resolve_matvec",
            "matvec_launch",
            "worst_scaled_error",
        ),
    },
)

__all__ = list(_HOMES)
