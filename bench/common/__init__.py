"""What the benchmark commands share: each command's entry point, where bad input ends in one
line and a non-zero exit, and the checks of the paths a record goes to (``cli``); how a
record is made and written (``record``), a
child process run under a time limit that stops the child too (``bounded_run``), the
decode step's micro-benchmarks (``decode_timing``: copy bandwidth, device time of a piece,
the price of a wait by its kind between the step's own submissions), what the kernel
benchmarks share (``kernels``: Bonsai-27B's shape, the floor's bandwidth, device time) and
the kernel tail's benchmark that ``bench.kernel_bench`` prints and ``bench.gpu_check``
records (``kernel_tail``), and SASS read back (``sass``: instructions by class, loops, the
one launch's phases) for ``bench.sass_counts`` and the row-dot experiments; plain numpy
twins of the workbench's hot paths (``numpy_twins``) and each path timed beside its twin and
the machine's limit (``twin_rates``, for ``bench.sweep_rate --twins``).

``bench/`` holds the commands themselves (``python -m bench.NAME``), one a file.
"""
