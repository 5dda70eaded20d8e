"""The microVM back-end's VMM (crates/vmm) and the worker's `vm` back-end.

What runs depends on the host's KVM: without /dev/kvm everything here skips; on PVM (the
kvm_pvm module, virtualization without VT-x or AMD-V, which this project's CI machine has)
the VMM boots a small test guest through the same boot path as Linux and the worker refuses
the back-end with the reason; with hardware virtualization the back-end serves lambdas
(its guest kernel built on demand by the worker's first start)."""

import os
import subprocess
from pathlib import Path

import pytest

import sprout
from conftest import EXAMPLES, ROOT, Worker

VMM = ROOT / "target" / "release" / "sprout-vmm"


def kvm_host():
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
    except OSError:
        return "missing"
    return "pvm" if Path("/sys/module/kvm_pvm").exists() else "hardware"


needs_kvm = pytest.mark.skipif(kvm_host() == "missing", reason="no /dev/kvm on this host: no microVMs")


def build_console_guest(tmp_path):
    """A guest that is not Linux (guest/console_guest.c), built in a second: it prints the
    command line and memory map the VMM handed it, then floods the console. The boot path
    is tested with it, without the guest kernel a PVM host cannot run and never builds."""
    elf = tmp_path / "console_guest.elf"
    subprocess.run(["gcc", "-static", "-nostdlib", "-ffreestanding", "-fno-pie", "-no-pie", "-fno-stack-protector",
                    "-mno-red-zone", "-mgeneral-regs-only", "-O2", "-Wl,--build-id=none", "-o", str(elf),
                    str(Path(__file__).parent / "guest" / "console_guest.c")], check=True)
    return elf


def vmm(*args, timeout=120):
    return subprocess.run([str(VMM), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_vmm_names_what_is_wrong_with_its_input(tmp_path):
    missing = vmm("--kernel", tmp_path / "nothing")
    assert missing.returncode == 1 and "opening the guest kernel" in missing.stderr and "nothing" in missing.stderr
    not_elf = tmp_path / "kernel.txt"
    not_elf.write_text("not a kernel\n")
    if kvm_host() != "missing":
        bad = vmm("--kernel", not_elf)
        assert bad.returncode == 1 and "an uncompressed ELF vmlinux" in bad.stderr, bad.stderr
    small = vmm("--kernel", not_elf, "--memory-mib", "8")
    assert small.returncode == 1 and "guest memory must be 16 to" in small.stderr, small.stderr
    no_disk = vmm("--kernel", not_elf, "--disk", tmp_path / "none.img")
    assert no_disk.returncode == 1 and "none.img" in no_disk.stderr, no_disk.stderr


@needs_kvm
def test_vmm_boots_a_guest_and_stops_a_console_flood(tmp_path):
    """The boot path end to end: the ELF guest loaded above 1 MiB, entered in long mode with
    our zero page in rsi (the guest prints our command line and memory map from it), the
    serial console, and the flood limit, which stops the VM (exit 124)."""
    console = tmp_path / "console.log"
    run = vmm("--kernel", build_console_guest(tmp_path), "--memory-mib", "64", "--console", console, "--console-limit", "1024",
              "--cmdline", "sprout.test=vmm")
    assert run.returncode == 124, run.stderr
    assert "console passed 1024 bytes" in run.stderr
    text = console.read_text(errors="replace")
    assert len(console.read_bytes()) == 1024
    lines = text.splitlines()
    assert lines[0] == "sprout test guest"
    assert lines[1].startswith("command line: console=ttyS0") and lines[1].endswith(" sprout.test=vmm")
    # The e820 map: low memory below the EBDA, then 1 MiB up to the end of the 64 MiB.
    assert lines[2] == "e820: 0x0000000000000000-0x000000000009fbff usable"
    assert lines[3] == "e820: 0x0000000000100000-0x0000000003ffffff usable"
    assert lines[4].startswith("flood flood ")


@pytest.mark.skipif(kvm_host() != "pvm", reason="only a PVM host refuses the vm back-end")
def test_worker_refuses_the_vm_backend_on_a_pvm_host(tmp_path):
    w = Worker(tmp_path / "worker", {"sandbox": {"backend": "vm"}})
    with pytest.raises(RuntimeError) as failed:
        w.start()
    assert "this host's KVM is PVM" in str(failed.value) and "hardware virtualization" in str(failed.value)
    assert w.leftovers() == []


@pytest.fixture
def vm_worker(make_worker):
    if kvm_host() != "hardware":
        pytest.skip(f"this host's KVM is {kvm_host()}: the vm back-end needs hardware virtualization (docs/vm.md)")
    w = make_worker(sandbox={"backend": "vm", "start_timeout_ms": 60000}, limits={"timeout_ms": 3000, "memory_mb": 128})
    w.client.deploy(str(EXAMPLES / "echo"))
    w.client.deploy(str(EXAMPLES / "hello"))
    w.client.deploy(str(EXAMPLES / "fail"))
    return w


def test_vm_backend_runs_function_and_wsgi_lambdas(vm_worker):
    assert vm_worker.client.stats()["backend"] == "vm"
    assert vm_worker.client.run("echo", {"x": [1, 2]}) == {"x": [1, 2]}
    assert vm_worker.client.request("GET", "hello", "/ada").body == b"<h1>Hello, ada!</h1>\n"
    second = vm_worker.client.request("POST", "echo", "", b"2")
    assert second.headers["x-sprout-start"] == "warm" and second.json() == 2


def test_vm_backend_reports_handler_errors_and_timeouts(vm_worker):
    with pytest.raises(sprout.SproutError) as err:
        vm_worker.client.run("fail")
    assert err.value.code == "handler_exception" and "RuntimeError" in err.value.traceback
    vm_worker.deploy_source("badimport", "import nothing_here\ndef f(e):\n    return e\n")
    with pytest.raises(sprout.SproutError) as err:
        vm_worker.client.run("badimport")
    assert err.value.code == "load_error"
    vm_worker.deploy_test_lambda("sleepy")
    with pytest.raises(sprout.SproutError) as err:
        vm_worker.client.run("sleepy", {"seconds": 30})
    assert err.value.code == "timeout"
    assert vm_worker.client.run("echo", 5) == 5


def load_vm_helper():
    """The helper's vm role (python/sprout/runtime/vm.py), loaded as the helper loads it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sprout_helper", ROOT / "python" / "sprout" / "runtime" / "helper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load.runtime_module("vm")


def test_a_vm_helper_writes_the_lambdas_code_only_under_handler(tmp_path, monkeypatch):
    """The code frame a VM's helper receives first (vm/backend.rs, code_frame): files land
    under /handler (here a temporary one), and a path leaving it is refused."""
    import socket

    vm = load_vm_helper()
    monkeypatch.setattr(vm.load, "HANDLER_DIR", str(tmp_path / "handler"))
    (tmp_path / "handler").mkdir()
    worker_end, vm_end = socket.socketpair()
    with worker_end, vm_end:
        vm.channel.send_frame(worker_end, {"op": "code", "files": [["f.py", 5, 0o644], ["lib/m.py", 2, 0o755]]}, b"x = 1ab")
        vm.receive_code(vm_end)
        assert (tmp_path / "handler" / "f.py").read_bytes() == b"x = 1"
        assert (tmp_path / "handler" / "lib" / "m.py").read_bytes() == b"ab"
        vm.channel.send_frame(worker_end, {"op": "code", "files": [["../escape.py", 1, 0o644]]}, b"x")
        with pytest.raises(ValueError, match="bad code file entry"):
            vm.receive_code(vm_end)
        assert not (tmp_path / "escape.py").exists()
        vm.channel.send_frame(worker_end, {"op": "init"}, b"")
        with pytest.raises(ValueError, match="expected the lambda's code"):
            vm.receive_code(vm_end)
