"""What the benchmark commands share, one concept a module.

``cli``: a command's command line (its parser, its entry point where bad input ends in one
line and a non-zero exit, the checks of the paths a record goes to, a progress bar);
``record``: what a record carries and writing it; ``timing``: how every bench times
(interleaved rounds, a piece's device time, the one copy bandwidth a floor divides by);
``ledger``: a measured wait price filed in the ledger; ``bounded_run``: a child process run
under a time limit that stops the child too; ``stages``: the decode step's stages timed
(``run_stages``); ``decode_timing``: a wait's price by its kind between the step's own
submissions; ``kernels``: what the kernel benchmarks share (Bonsai-27B's shape, the floor's
bandwidth, device time); ``kernel_tail``: the kernel tail's benchmark; ``sass``: SASS read
back; ``step_profile``: a decode step's ops and device profile; ``numpy_twins`` and
``twin_rates``: plain numpy twins of the hot paths, each timed beside its twin.

``bench/`` holds the commands themselves (``python -m bench.NAME``), one a file.
"""
