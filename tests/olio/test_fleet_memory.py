"""The fleet's memory measurement (apps/olio/olio_deploy/fleet_memory.py): PSS summed over
a deployment's processes, each address space once, as gVisor's systrap stubs share theirs."""

import os
import subprocess

from olio_deploy.fleet_memory import pss_mib


def test_each_address_space_counts_once():
    me = os.getpid()
    alone, counted = pss_mib([me])
    assert alone > 0 and counted == 1
    # Listed twice, one address space: measured twice, counted once.
    assert abs(pss_mib([me, me])[0] - alone) < 1
    with subprocess.Popen(["sleep", "10"]) as other:
        together, counted = pss_mib([me, other.pid])
        other.kill()
    assert counted == 2 and together > alone, "a process of its own adds its memory"
    assert pss_mib([me, 2**22 + 1]) == (alone, 1), "a process that is gone counts nothing"
