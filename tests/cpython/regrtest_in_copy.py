"""Runs CPython's regrtest in this interpreter copy with a temp dir of its own.

Used to run the suite in several copies of one process at once (`orochi python --copies N`):
regrtest names its working directory after the pid, which all copies share, so each copy gets
TEMP_BASE/copy<N> as its --tempdir.

    regrtest_in_copy.py TEMP_BASE [regrtest arguments...]
"""

import os
import sys

import _orochi
from test.libregrtest import main

temp_dir = os.path.join(sys.argv[1], f"copy{_orochi.copy_id()}")
os.makedirs(temp_dir, exist_ok=True)
sys.argv = [sys.argv[0], "--tempdir", temp_dir, *sys.argv[2:]]
main()
