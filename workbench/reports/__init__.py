"""Reports: bench records read back, and the tables and figures the notebooks show.

One module a record kind, named after the bench command that writes it (``sanitize``,
``launch_profile``, ``kernel_bodies``); ``tables`` cuts text tables to fit 100 columns;
``plots`` draws the notebooks' figures. Reports may import any part; no part imports
them.
"""
