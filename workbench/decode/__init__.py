"""A hybrid model's decode step, run stage by stage of the plan.

``schedule`` executes one token of a hybrid (Gated DeltaNet and attention layers) with
the waits each stage of the plan makes, and checks every stage against the first;
``matvec`` runs the step's matrix products as MLX ops or through the project's kernels.
"""
