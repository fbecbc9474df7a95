"""The fold and the weights it folds into.

``hadamard`` is the block-Hadamard transform (the numbers); ``rotation`` the fold itself,
``HadamardFold`` (signs, permutation, blocks, the site where it sits, and the plan a
kernel takes); ``formats`` the one table of weight formats (``Format``: its name, its
mode and bits, its group size and the code the kernels read it by); ``weights`` the
matrices that carry a fold, dense or quantized (``WeightMatrix``).

The names below are the part's API, importable from ``workbench.fold`` itself (``from
workbench.fold import HadamardFold``); each module is imported when one of its names is first read.
"""

from workbench import public_names

_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        "hadamard": ("block_transform", "factor_block", "hadamard_matrix", "ROW_GROUP"),
        "rotation": ("HadamardFold", "FoldSite", "FoldPlan"),
        "formats": (
            "Format",
            "FORMATS",
            "KERNEL_FORMATS",
            "SCALE_CODES",
            "FLOAT32",
            "FLOAT16",
            "BFLOAT16",
            "AFFINE4",
            "AFFINE8",
            "AFFINE2",
            "MXFP4",
            "MXFP8",
            "NVFP4",
        ),
        "weights": (
            "WeightMatrix",
            "QuantizedBase",
            "QuantSpec",
            "QUANT_FORMATS",
            "DENSE_DTYPES",
            "check_quant_spec",
            "quantized_matmul",
            "outlier_matrix",
            "quantization_study",
        ),
    },
)

__all__ = list(_HOMES)
