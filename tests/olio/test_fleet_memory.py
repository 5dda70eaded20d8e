"""The fleet's memory measurement (apps/olio/olio_deploy/fleet_memory.py): PSS summed over
a deployment's processes, each address space once, as gVisor's systrap stubs share theirs."""

import os
import subprocess
import sys

from olio_deploy.fleet_memory import pss_mib


def test_each_address_space_counts_once():
    me = os.getpid()
    alone, counted = pss_mib([me])
    assert alone > 0 and counted == 1
    # Listed twice, one address space: measured twice, counted once.
    twice, counted = pss_mib([me, me])
    assert counted == 2 and abs(twice - alone) < 4, (twice, alone)
    holder = "import sys; held = bytearray(16 << 20); print(flush=True); sys.stdin.read()"
    with subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as other:
        other.stdout.readline()  # its 16 MiB are touched
        together, counted = pss_mib([me, other.pid])
        other.kill()
    assert counted == 2 and together > alone + 12, "a process of its own adds its memory"
    gone, counted = pss_mib([me, 2**22 + 1])
    assert counted == 1 and abs(gone - alone) < 4, "a process that is gone counts nothing"
