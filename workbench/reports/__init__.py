"""Reports: bench records read back, and the tables and figures the notebooks show.

``records`` is the contract every record kind keeps (its schema, shared with the bench
command that writes it: ``load``, ``load_all``, ``newest``, ``check``, ``headline``); then one
module a record kind, named after the bench command that writes it (``gpu_check``,
``kernel_bench``, ``one_launch``, ``launch_profile``, ``kernel_bodies``, ``sanitize``,
``schedule_run``, ``real_model``, ``launch_host_cost``), each turning records into tables;
``tables`` cuts text tables to fit 100 columns; ``plots`` draws the notebooks' figures. Reports may
import any part; no part
imports them. Notebooks read records only through here, never from a file themselves.

The record modules, ``plots`` and ``tables`` are public names themselves, as namespaces (their
functions' names are generic: ``from workbench.reports import records`` then ``records.load``);
the figures and the table cutters are public by name too (``from workbench.reports import fit,
plot_rotation``). Each module is imported when first read; pandas and matplotlib with it.
"""

from workbench import public_names

_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        "tables": ("fit", "wrap"),
        "plots": (
            "plot_refusal_map",
            "plot_rotation",
            "plot_quantization_study",
            "plot_stage_ms",
            "plot_wait_share",
            "plot_schedule_runs",
            "plot_stage_clock",
            "plot_error_histograms",
            "plot_error_ecdf",
            "plot_fold_effect",
            "plot_catch_rates",
        ),
    },
    namespaces=(
        "records",
        "gpu_check",
        "kernel_bench",
        "one_launch",
        "launch_profile",
        "kernel_bodies",
        "sanitize",
        "schedule_run",
        "real_model",
        "launch_host_cost",
        "plots",
        "tables",
    ),
)

__all__ = list(_HOMES)
