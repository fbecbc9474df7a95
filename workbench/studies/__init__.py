"""Error studies on the tail: how far a fast path is from the float64 truth.

``cases`` draws blocks of seeded cases; ``sweeps`` measures every error metric over
them (and over deliberate faults); ``calibration`` turns those distributions into
tolerances and catch rates; ``three_way`` sets fused against host against truth;
``exact_oracle`` is the kernels' float64 oracle with weights dequantized in numpy;
``metal_check`` runs the emulated Metal kernels beside the graph tail and the oracle, in
every schedule and math mode; ``metal_math_modes`` sweeps the tail's error under Metal's
precise and fast math contracts.
"""
