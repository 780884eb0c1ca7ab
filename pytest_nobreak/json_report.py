"""The old path of ``python -m pytest_nobreak.json_report merge ...``, kept for CI scripts.

The JSON report now lives in :mod:`pytest_nobreak.report.json_report`; this entry point runs
the same ``main``.
"""

import sys

from pytest_nobreak.report.json_report import main

if __name__ == "__main__":
    sys.exit(main())
