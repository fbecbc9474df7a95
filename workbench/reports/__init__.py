"""Reports: bench records read back, and the tables and figures the notebooks show.

``records`` is the contract every record kind keeps (its schema, shared with the bench
command that writes it: ``load``, ``load_all``, ``newest``, ``check``, ``headline``); then one
module a record kind, named after the bench command that writes it (``gpu_check``,
``kernel_bench``, ``one_launch``, ``launch_profile``, ``kernel_bodies``, ``sanitize``,
``schedule_run``, ``real_model``, ``launch_host_cost``), each turning records into tables; ``tables`` cuts text tables to fit 100
columns; ``plots`` draws the notebooks' figures. Reports may import any part; no part
imports them. Notebooks read records only through here, never from a file themselves.
"""
