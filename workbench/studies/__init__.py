"""Error studies on the tail: how far a fast path is from the float64 truth.

``cases`` draws blocks of seeded cases; ``sweeps`` measures every error metric over
them (and over deliberate faults); ``calibration`` turns those distributions into
tolerances and catch rates; ``three_way`` sets fused against host against truth;
``exact_oracle`` is the kernels' float64 oracle with weights dequantized in numpy;
``metal_check`` runs the emulated Metal kernels beside the graph tail and the oracle, in
every schedule and math mode; ``metal_math_modes`` sweeps the tail's error under Metal's
precise and fast math contracts.

The names below are the part's API, importable from ``workbench.studies`` itself; each module
is imported when one of its names is first read. ``metal_math_modes`` is public as a namespace
(its names, ``VARIANTS``, ``summary``, are generic).
"""

from workbench import public_names

_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        "cases": (
            "CASE_BLOCK",
            "SWEEP_SALT",
            "OUTLIER_SCALE",
            "CaseArrays",
            "case_arrays",
            "case_floats",
            "case_row_weights",
            "quant_spec",
            "fold_for_case",
            "check_fold",
            "check_quant_fits",
            "check_seeds",
            "check_shape",
        ),
        "sweeps": ("sweep", "mutation_sweep", "MUTATIONS", "MUTATION_DOC"),
        "calibration": (
            "Tolerance",
            "calibrate_tolerance",
            "calibrate_by",
            "catch_rates",
            "pass_rates",
            "REFERENCE_TOLERANCES",
        ),
        "three_way": ("three_way_table", "FAULTS", "VERDICTS"),
        "exact_oracle": ("host_tail_exact", "dequantize_exact", "oracle_tolerance", "tolerance_for"),
        "metal_check": ("PROVES", "SAME_BITS", "metal_check_table"),
    },
    namespaces=("metal_math_modes",),
)

__all__ = list(_HOMES)
