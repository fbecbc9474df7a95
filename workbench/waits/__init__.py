"""Waits: GPU-to-host round trips, counted, planned and priced.

``plan`` is the resident-state plan (its stages, which submissions each makes, the price
model and the wait table); ``ledger`` the wait prices the table multiplies by, measured or
quoted; ``schema`` what the plan's and the ledger's files share (strict JSON, a wait's
split kind); ``measurement`` counts the waits a piece of code makes and times one wait,
or the split between two real submissions.
"""
