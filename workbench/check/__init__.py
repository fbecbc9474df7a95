"""Checking a user's own fused tail against the float64 oracle.

``stored`` what an implementation is handed for a case (the weights as stored); ``subjects``
the forms of the implementation under test (a callable, a kernels folder, a Metal or CUDA
source); ``source_launch`` a source and its launch, and the one adapter to the CPU emulator;
``time_limit`` a call under a time limit; ``faults`` the fault models; ``verdict`` the paired
sign test against the workbench's graph tail; ``run`` the check itself; ``report`` its
:class:`~workbench.check.report.CheckReport` (``report_figure`` the figure); ``calls`` the
implementation's two runs of a block, ``guards`` a call guarded (fresh inputs verified
unchanged, no aliased output), ``isolation`` the implementation (a callable, a kernels folder,
a source) in a worker process of its own; ``dump`` an engine's dumped layers (read and
written); ``replay`` each failing case as a reproducer, run again; ``mutants`` source-level
mutants of a user's kernel text, run through the same check; ``tolerances`` tolerances per
input scale, their catches beside their flakes; ``blocks`` the check's own work (stored
weights, truth, reference) a block of cases at a time, ``budget`` how many fit a memory
budget, ``draws`` its cases drawn into a reused buffer, ``columns`` the columns that do not
depend on the implementation kept by case key, ``shards`` a check cut into shards that merge
(its tables in Parquet) and an interrupted run resumed, ``progress`` the bar of cases done.
``parts`` the parts of a layer the check takes (the tail, the Gated DeltaNet step);
``gdn_cases``, ``gdn_faults``, ``gdn_subjects``,
``gdn_run``, ``gdn_report`` the recurrent step's runs of tokens, truth and faults, forms, check
and report; ``gdn_dump`` an engine's dumped run of the step, read and judged; ``pack_run`` and
``pack_faults`` a tail read from a Hadamard pack (every linear rotating its own input), checked
on the pack's own stored weights, with the faults of those rotations; ``pack_linear`` one packed
projection of it (Q/K/V, a recurrent layer's) checked on its own; ``pack_head`` a pack layer's
attention head, ``pack_attention`` its whole attention module over a run of tokens (the KV
cache, the gate, o_proj), ``pack_step`` its recurrent layer (projections, step, out_proj over a run of
tokens), each projection its own rotation, ``pack_verdict`` their rows and verdict.
``head_spec``, ``head_math``, ``head_mlx``, ``head_cases``, ``head_subjects``, ``head_run``,
``head_report``: the attention head's spec (frink-models' launch, or the model's head),
float64 truth and faults, float32 reference, cases, forms, check and report; ``head_dump``
an engine's dumped heads, read, written and judged; ``head_mutants`` a head kernel's source
mutants through the head's check.
``chain_links``, ``chain_wiring``, ``chain_forms``, ``chain_run``, ``chain_report``: parts
chained as the engine launches them (the tail, the next layer's input norm and projections,
its recurrent step, the next head), each link's oracle and reference, the chain wired and its
cases, a part's own forms (kernels folder, source) as links, the check against the chained
float64 truth and its report; ``chain_faults`` each link's fault models run in a chain, and
whether the faulty link is the one named first. ``cluster`` the check's shards of seeds on a Dask
cluster (``check_kernel(..., client=)``), ``cluster_worker`` what a worker runs and how the
subject reaches it, ``cluster_callables`` a callable sent by value made importable there,
``cluster_sweeps`` the error sweeps there, a task a block of seeds, ``cluster_settling`` the
calibrated tolerance and catch rates as the seeds grow. The
command is ``__main__`` (the tail) with ``gdn_command`` (``--part gdn``) and ``chain_command``
(``--chain``) and ``head_command`` (``--part head``), over ``command_args`` (what they parse alike).

The names below are the part's API, importable from ``workbench.check`` itself; each module
is imported when one of its names is first read.
"""

from workbench import public_names

_HOMES, __getattr__, __dir__ = public_names(
    __name__,
    {
        "faults": ("FAULTS", "faulty_tail"),
        "run": ("check_kernel", "check_dump"),
        "shards": ("merge_reports", "read_report", "write_tables", "Journal"),
        "budget": ("default_budget",),
        "cluster": ("cluster_client",),
        "cluster_sweeps": ("sweep_on_cluster", "mutation_sweep_on_cluster"),
        "cluster_settling": ("settling",),
        "report": ("CheckReport",),
        "dump": ("write_layer", "read_layer", "DumpError"),
        "replay": ("replay", "read_reproducer", "Replay"),
        "source_launch": ("SourceLaunch",),
        "stored": ("StoredCase", "StoredMatrix", "stored_case"),
        "subjects": ("CallableSubject", "KernelsFolderSubject", "SourceSubject", "SubjectError"),
        "mutants": ("Mutant", "MutantStudy", "source_mutants", "mutant_study", "folder_mutant_study"),
        "tolerances": ("calibrated_per_scale", "catch_and_flake"),
        "parts": ("Part", "PART_NAMES", "part"),
        "gdn_run": ("check_step", "STEP_SCALES", "STATE_SCALES", "DEFAULT_HORIZONS"),
        "gdn_report": ("StepReport",),
        "gdn_dump": ("check_step_dump", "read_run", "DumpedRun"),
        "gdn_faults": ("GDN_FAULTS", "StepWeights"),
        "pack_faults": ("PACK_FAULTS", "packed_faulty_tail"),
        "pack_run": ("check_pack_tail",),
        "pack_linear": ("check_packed_linear", "LINEAR_FAULTS"),
        "pack_head": ("check_pack_head", "PACK_HEAD_FAULTS", "pack_head_spec"),
        "pack_attention": ("check_pack_attention", "PACK_ATTENTION_FAULTS"),
        "pack_step": ("check_pack_recurrent", "PACK_STEP_FAULTS", "pack_step_weights"),
        "gdn_cases": ("GATES", "DEFAULT_GEOMETRIES", "TokenRun", "token_run"),
        "head_spec": ("HeadSpec", "HEAD_SHAPES", "DEFAULT_HEAD_SPECS"),
        "head_math": ("HEAD_FAULTS", "head_exact", "HeadWeights"),
        "head_mlx": ("head_reference",),
        "head_cases": ("HeadInputs", "HeadCases", "draw_head_cases", "DEFAULT_POSITIONS", "HEAD_SCALES"),
        "head_subjects": ("CallableHead", "KernelsFolderHead", "HeadSource", "HEAD_INPUTS"),
        "head_run": ("check_head",),
        "head_report": ("HeadReport",),
        "head_dump": ("check_head_dump", "read_heads", "write_head", "DumpedHeads"),
        "head_mutants": ("head_mutant_study",),
        "gdn_subjects": ("StepInputs", "CallableStep", "KernelsFolderStep", "StepSource", "STEP_INPUTS"),
        "chain_links": ("ChainDims", "Link", "LINKS", "LINK_NAMES"),
        "chain_wiring": ("Chain", "ChainCase", "LinkCase", "wire"),
        "chain_run": ("check_chain", "chained_outputs", "CHAIN_SCALES", "CHAIN_GATES", "CHAIN_STATE_SCALES"),
        "chain_report": ("ChainReport",),
        "chain_faults": ("chain_fault_table", "faulty_link", "link_faults", "GDN_IN_FAULTS"),
    },
)

__all__ = list(_HOMES)
