"""What the benchmark commands share: how a record is made and written (``record``), a
child process run under a time limit that stops the child too (``bounded_run``), the
decode step's micro-benchmarks (``decode_timing``: copy bandwidth, device time of a piece,
the price of a wait by its kind between the step's own submissions), what the kernel
benchmarks share (``kernels``: Bonsai-27B's shape, the floor's bandwidth, device time) and
the kernel tail's benchmark that ``bench.kernel_bench`` prints and ``bench.gpu_check``
records (``kernel_tail``), and SASS read back (``sass``: instructions by class, loops, the
one launch's phases) for ``bench.sass_counts`` and the row-dot experiments.

``bench/`` holds the commands themselves (``python -m bench.NAME``), one a file.
"""
