"""Keep a VM's CPUs from halting while a benchmark runs: one idle-class (SCHED_IDLE) spinner
per CPU, named `cpu-awake`, which any other task preempts at once.

Why: on some VMs a halted vCPU wakes slowly (on the 2-core Firecracker guests here a Python
pipe round trip between CPUs took 380 µs with both idle, 36 µs with them kept awake), so a
benchmark's latencies measure the hypervisor's wake-ups, and their noise, more than the
software. Kept awake, the figures are the software's; the spinners' own CPU is named, so a
profile leaves it out. Used by bench/ab_sandboxes.py and bench/profile_warm_path.py
(`--keep-cpus-awake`).
"""

import contextlib
import os
import subprocess
import sys

NAME = "cpu-awake"
# Named, and killed with the benchmark that started it (PR_SET_NAME, PR_SET_PDEATHSIG).
SPIN = ("import ctypes\nlibc = ctypes.CDLL(None)\nlibc.prctl(15, b'" + NAME + "', 0, 0, 0)\nlibc.prctl(1, 9, 0, 0, 0)\n"
        "while True:\n    pass\n")


@contextlib.contextmanager
def cpus_awake(enabled=True, cpus=None):
    """While the block runs, a spinner on each CPU in `cpus` (default: all this process may
    use); nothing when not `enabled`."""
    if not enabled:
        yield []
        return
    spinners = []
    try:
        for cpu in sorted(cpus if cpus is not None else os.sched_getaffinity(0)):
            spinner = subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=lambda c=cpu: _idle_on(c))
            spinners.append(spinner)
        yield [s.pid for s in spinners]
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _idle_on(cpu):
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
