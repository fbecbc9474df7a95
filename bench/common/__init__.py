"""What the benchmark commands share: how a record is made and written (``record``), and a
child process run under a time limit that stops the child too (``bounded_run``).

``bench/`` holds the commands themselves (``python -m bench.NAME``), one a file.
"""
