"""Waits: GPU-to-host round trips, counted, planned and priced.

``plan`` is the resident-state plan (its stages, which submissions each makes, the price
model and the wait table); ``ledger`` the wait prices the table multiplies by, measured or
quoted; ``schema`` what the plan's and the ledger's files share (strict JSON, a wait's
split kind); ``measurement`` counts the waits a piece of code makes and times one wait,
or the split between two real submissions.

The names below are the part's API, importable from ``workbench.waits`` itself; each module
is imported when one of its names is first read.
"""

from workbench import public_names

_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        "plan": (
            "Plan",
            "Stage",
            "load_plan",
            "as_plan",
            "HOST_READ",
            "eligible_layers",
            "submissions",
            "waits_per_token",
            "split_kinds",
            "check_split_kind",
            "join_splits",
            "priced_waits",
            "model_saving",
            "wait_table",
            "wait_share",
            "waits_by_model",
        ),
        "ledger": ("LEDGER_PATH", "load_ledger", "ledger_split_prices", "add_price", "check_entry"),
        "measurement": ("count_waits", "measure_wait_price", "measure_split_price", "measure_split_between"),
    },
)

__all__ = list(_HOMES)
