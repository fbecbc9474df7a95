"""The fold and the weights it folds into.

``hadamard`` is the block-Hadamard transform (the numbers); ``rotation`` the fold itself,
``HadamardFold`` (signs, permutation, blocks, the site where it sits, and the plan a
kernel takes); ``formats`` the one table of weight formats (``Format``: its name, its
mode and bits, its group size and the code the kernels read it by); ``weights`` the
matrices that carry a fold, dense or quantized (``WeightMatrix``).
"""
