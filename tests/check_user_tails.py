"""Tails a user might write, importable by path for the command-line tests."""
from tests.test_check_run import user_tail


def correct(case):
    return user_tail(case)


def eps_outside(case):
    return user_tail(case, eps_outside=True)
