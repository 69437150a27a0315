"""Runs CPython's regrtest in one of several copies of one process running it at once.

    regrtest_in_copy.py TEMP_BASE [regrtest arguments...]

regrtest makes TEMP_BASE/test_python_<pid> its working directory and removes it at the end. The
working directory belongs to the process, and all copies share the pid, so this script creates
that directory first and starts in it: regrtest then neither creates nor removes it, and every
copy works in the same, unchanging directory. (Tests that write pid-named files there are in
skips-concurrent.txt.)
"""

import os
import sys

from test.libregrtest import main
from test.support import os_helper

temp_base = sys.argv[1]
work_dir = os.path.join(temp_base, f"test_python_{os.getpid()}{os_helper.FS_NONASCII}")
os.makedirs(work_dir, exist_ok=True)
# Start there too, so that the copy finishing first "restores" the directory it is already in
# instead of moving the other copies out of it.
os.chdir(work_dir)
sys.argv = [sys.argv[0], "--tempdir", temp_base, *sys.argv[2:]]
main()
