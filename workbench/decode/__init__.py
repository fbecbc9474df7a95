"""A hybrid model's decode step, run stage by stage of the plan.

``geometry``: a hybrid's widths; ``state``: its random weights and what a decode keeps
between tokens; ``layers``: the Gated DeltaNet step and the attention as lazy ops;
``schedule``: one token executed as a stage of the plan, checked and timed; ``savings``:
measured savings against the wait table's and the price model's; ``matvec``: the step's
matrix products as MLX ops or through the project's kernels.
"""
