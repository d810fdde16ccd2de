"""``python -m MODULE ARGS...`` for ``preloaded.run_script``: run MODULE as ``__main__`` with ARGS as its argv.

Usage: run_script(helpers / "run_module.py", [MODULE, *ARGS], ...) runs what ``python -m MODULE ARGS`` runs, forked
from the interpreter that already imported the heavy libraries.
"""

import runpy
import sys

if __name__ == "__main__":
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
