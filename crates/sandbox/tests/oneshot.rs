//! One-shot sandboxes (what pip runs in) on the real base image, as root: a program's output
//! comes back, and the installer's limits hold — a time limit kills it, a memory limit is
//! reported as such — with nothing left mounted or in the cgroup afterwards.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sprout_sandbox::cgroup::{Layout, Limits, Version};
use sprout_sandbox::oneshot::{self, Bind, Ending, OneshotSpec};
use sprout_sandbox::stage::Stage;

const BASE: &str = "/var/lib/sprout/base-bookworm";

fn spec(code: &str, limits: Limits, timeout: Duration, binds: Vec<Bind>) -> OneshotSpec {
    OneshotSpec {
        name: "test".into(),
        argv: vec!["/usr/bin/python3".into(), "-I".into(), "-S".into(), "-c".into(), code.into()],
        env: vec![("GREETING".into(), "hello".into())],
        binds,
        limits,
        timeout,
        uid: 65534,
        gid: 65534,
        scratch_mb: 16,
        workdir: "/".into(),
    }
}

fn mounts_under(dir: &Path) -> usize {
    sprout_sandbox::mountinfo::read().unwrap().iter().filter(|m| m.mount_point.starts_with(dir)).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_program_runs_under_the_installers_limits_and_leaves_nothing() {
    assert!(
        sprout_sandbox::base::is_ready(Path::new(BASE), "bookworm"),
        "no base image at {BASE}: run `sprout worker init` (scripts/setup.sh does)"
    );
    let work = tempfile::tempdir().unwrap();
    let packages = work.path().join("packages");
    std::fs::create_dir_all(&packages).unwrap();
    let stage = Stage::prepare(&work.path().join("w"), Path::new(BASE), &packages).unwrap();
    let layout = Arc::new(Layout::detect(Version::Auto, None).unwrap());
    let parent = format!("sprout-oneshot-test-{}", std::process::id());
    layout.create_parent(&parent).unwrap();
    let roomy = Limits { memory_bytes: 256 << 20, pids: 64, cpus: 0.0 };

    // Output comes back; the environment and a writable bind arrive; the user is unprivileged.
    let shared = work.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::os::unix::fs::chown(&shared, Some(65534), Some(65534)).unwrap();
    let code = "import os; open('/host/work/out', 'w').write('x'); print(os.environ['GREETING'], os.getuid(), os.getpid())";
    let binds = vec![Bind { src: shared.clone(), dst: "/host/work".into(), writable: true }];
    let out = oneshot::run(&stage, layout.clone(), &parent, &spec(code, roomy, Duration::from_secs(30), binds)).await.unwrap();
    assert_eq!(out.ending, Ending::Exited(0), "{}", out.output);
    assert_eq!(out.output.trim(), "hello 65534 1");
    assert_eq!(std::fs::read_to_string(shared.join("out")).unwrap(), "x");

    // A program that runs past the time limit is killed, with everything it started.
    let code = "import os, time\nif os.fork() == 0:\n    time.sleep(600)\ntime.sleep(600)";
    let out = oneshot::run(&stage, layout.clone(), &parent, &spec(code, roomy, Duration::from_millis(500), vec![])).await.unwrap();
    assert_eq!(out.ending, Ending::TimedOut);
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);

    // One that passes the memory limit is reported as out of memory.
    let tight = Limits { memory_bytes: 48 << 20, pids: 64, cpus: 0.0 };
    let code = "blocks = [bytearray(1 << 20) for _ in range(200)]\nfor b in blocks:\n    b[::4096] = b'x' * len(b[::4096])";
    let out = oneshot::run(&stage, layout.clone(), &parent, &spec(code, tight, Duration::from_secs(30), vec![])).await.unwrap();
    assert!(matches!(out.ending, Ending::OutOfMemory | Ending::Signaled(9)), "{:?}: {}", out.ending, out.output);
    assert_eq!(out.ending, Ending::OutOfMemory, "the OOM kill was not recognized");

    // A failing program's exit status and words come back.
    let out = oneshot::run(&stage, layout.clone(), &parent, &spec("raise SystemExit('no luck')", roomy, Duration::from_secs(30), vec![]))
        .await
        .unwrap();
    assert_eq!(out.ending, Ending::Exited(1));
    assert!(out.output.contains("no luck"));

    // Nothing is left: no mounts of the one-shot roots, no processes, no groups below ours.
    assert_eq!(mounts_under(&stage.run.join("oneshot")), 0);
    assert!(layout.procs_in_tree(&parent).is_empty());
    stage.teardown().unwrap();
    layout.remove_tree(&parent).unwrap();
}
