"""Tests of the decodeplane Python client, against the daemon binary."""

import faulthandler

# A hung test dumps every thread's stack and ends the run instead of
# hanging CI (the suite takes well under a minute).
faulthandler.dump_traceback_later(600, exit=True)
