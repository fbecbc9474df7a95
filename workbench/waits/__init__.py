"""Waits: GPU-to-host round trips, counted, planned and priced.

``plan`` is the resident-state plan (its stages, which submissions each makes, the wait
table) and the wait-price ledger; ``measurement`` counts the waits a piece of code makes
and times one wait, or the split between two real submissions.
"""
