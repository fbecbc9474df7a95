"""The fold and the weights it folds into.

``hadamard`` is the block-Hadamard transform (the numbers); ``rotation`` the fold itself,
``HadamardFold`` (signs, permutation, blocks, the site where it sits, and the plan a
kernel takes); ``weights`` the matrices that carry a fold, dense or quantized
(``WeightMatrix``), with the one table of dtypes and quantization formats.
"""
