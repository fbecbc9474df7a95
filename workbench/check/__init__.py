"""Checking a user's own fused tail against the float64 oracle.

``stored`` what an implementation is handed for a case (the weights as stored);
``subjects`` the forms of the implementation under test (a callable, a kernels folder, a
Metal or CUDA source); ``source_launch`` a source and its launch, and the one adapter to the
CPU emulator; ``time_limit`` a call under a time limit; ``faults`` the fault models;
``verdict`` the paired sign test against the workbench's graph tail; ``run`` the check
itself and its :class:`~workbench.check.run.CheckReport`; ``dump`` an engine's dumped
layers (read and written); ``mutants`` source-level mutants of a user's kernel text, run
through the same check; ``tolerances`` tolerances per input scale, their catches beside
their flakes; ``blocks`` the check's own work (stored weights, truth, reference) a block
of cases at a time.
"""

from workbench.check.dump import write_layer
from workbench.check.faults import FAULTS, faulty_tail
from workbench.check.mutants import Mutant, MutantStudy, folder_mutant_study, mutant_study, source_mutants
from workbench.check.run import CheckReport, check_dump, check_kernel
from workbench.check.source_launch import SourceLaunch
from workbench.check.stored import StoredCase, StoredMatrix
from workbench.check.subjects import CallableSubject, KernelsFolderSubject, SourceSubject, SubjectError
from workbench.check.tolerances import calibrated_per_scale, catch_and_flake

__all__ = ["FAULTS", "faulty_tail", "CheckReport", "check_kernel", "check_dump", "write_layer", "SourceLaunch",
           "StoredCase", "StoredMatrix", "CallableSubject", "KernelsFolderSubject", "SourceSubject", "SubjectError",
           "Mutant", "MutantStudy", "source_mutants", "mutant_study", "folder_mutant_study", "calibrated_per_scale",
           "catch_and_flake"]
