//! Utilization of the system under test, sampled from /proc while a run goes (what vmstat,
//! mpstat, iostat and netstat show): CPU busy per CPU, memory in use, disk and network
//! throughput, and, given the deployment's processes, their proportional memory (PSS) and
//! their CPU time by kind of process.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    /// Seconds since sampling began.
    pub t: f64,
    /// Busy fraction (0-1) of each CPU over the last interval (all but idle and iowait).
    pub cpu_busy: Vec<f64>,
    /// iowait fraction over all CPUs.
    pub cpu_iowait: f64,
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
    pub disk_read_bytes_per_s: f64,
    pub disk_write_bytes_per_s: f64,
    /// Fraction of the interval some disk was busy (iostat's %util, the busiest disk).
    pub disk_util: f64,
    pub net_rx_bytes_per_s: f64,
    pub net_tx_bytes_per_s: f64,
    /// Sum of the PSS of the deployment's processes, when they are known.
    pub sut_pss_bytes: Option<u64>,
    /// The same by kind of process ([`process_kind`]): what holds the memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sut_pss_by_kind: Option<BTreeMap<String, u64>>,
}

/// Where the deployment's processes are listed: a cgroup directory (its `cgroup.procs`, and
/// those of its descendants).
#[derive(Debug, Clone)]
pub struct SutProcesses(pub PathBuf);

impl SutProcesses {
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        let mut dirs = vec![self.0.clone()];
        while let Some(dir) = dirs.pop() {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                dirs.extend(entries.flatten().filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false)).map(|e| e.path()));
            }
        }
        pids
    }
}

/// Sum of these processes' PSS (a page shared by n processes counts 1/n to each).
fn pss_of(pids: &[u32]) -> u64 {
    pss_each(pids).iter().map(|(_, bytes)| bytes).sum()
}

/// Each of these processes' PSS in bytes (those gone meanwhile left out; each address space
/// once, as gVisor's stubs share theirs: [`sprout_sandbox::memory::pss_each`]).
fn pss_each(pids: &[u32]) -> Vec<(u32, u64)> {
    let pids: Vec<i32> = pids.iter().map(|&pid| pid as i32).collect();
    sprout_sandbox::memory::pss_each(&pids).into_iter().map(|(pid, bytes)| (pid as u32, bytes)).collect()
}

/// The summed PSS, in bytes, of the processes in the cgroup directory `dir` and its
/// descendants, now.
pub fn pss_of_cgroup(dir: &std::path::Path) -> u64 {
    pss_of(&SutProcesses(dir.to_path_buf()).pids())
}

/// CPU time of the deployment's processes by what they are (postgres, gunicorn, nginx, the
/// Sprout worker, its sandboxes...): where the time goes. Processes present at the first look
/// count from then; those that appear later count from their start; one that exits between
/// two looks loses its last interval.
#[derive(Debug, Default)]
struct ProcessCpu {
    /// (pid, start time: a reused pid is another process) -> (what it is, ticks when first
    /// seen, ticks when last seen)
    seen: HashMap<(u32, u64), (String, u64, u64)>,
    /// What each process of the last look is, by pid.
    kinds: HashMap<u32, String>,
    looked: bool,
}

impl ProcessCpu {
    fn look(&mut self, pids: &[u32]) {
        self.kinds.clear();
        for &pid in pids {
            let Some((started, ticks)) = process_ticks(pid) else {
                continue;
            };
            let appeared_later = self.looked;
            let seen =
                self.seen.entry((pid, started)).or_insert_with(|| (process_name(pid), if appeared_later { 0 } else { ticks }, ticks));
            seen.2 = ticks;
            self.kinds.insert(pid, seen.0.clone());
        }
        self.looked = true;
    }

    /// Bytes per kind of process, of `each` (pid, bytes) of processes looked at.
    fn by_kind(&self, each: &[(u32, u64)]) -> BTreeMap<String, u64> {
        let mut by = BTreeMap::new();
        for (pid, bytes) in each {
            let kind = self.kinds.get(pid).map_or("other", String::as_str);
            *by.entry(kind.to_string()).or_insert(0) += bytes;
        }
        by
    }

    fn seconds_by_kind(&self) -> BTreeMap<String, f64> {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let mut by = BTreeMap::new();
        for (name, first, last) in self.seen.values() {
            *by.entry(name.clone()).or_insert(0.0) += last.saturating_sub(*first) as f64 / hz;
        }
        by
    }
}

/// (start time, user + system ticks) of a process, from /proc/PID/stat.
fn process_ticks(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some((field(19)?, field(11)? + field(12)?))
}

/// What a process is ([`process_kind`] of its command name and arguments).
fn process_name(pid: u32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    process_kind(comm.trim_end(), &args)
}

/// A process's kind for the breakdown: its command, with the subcommand of `sprout`, the
/// module or script of a Python interpreter, and the role of a PostgreSQL server process.
pub fn process_kind(comm: &str, args: &[String]) -> String {
    let base = |a: &str| a.rsplit('/').next().unwrap_or(a).to_string();
    if comm == "sprout" {
        return match args.get(1) {
            Some(sub) => format!("sprout {sub}"),
            None => "sprout".into(),
        };
    }
    if comm == "postgres" {
        // A server process titles itself `postgres: <role>`; a backend's role is its client.
        return match args.first().and_then(|a| a.strip_prefix("postgres: ")) {
            Some(title) if title.contains('(') || title.split_whitespace().count() > 3 => "postgres: backend".into(),
            Some(title) => format!("postgres: {}", title.trim()),
            None => "postgres".into(),
        };
    }
    if comm.starts_with("python") {
        if let Some(i) = args.iter().position(|a| a == "-m") {
            if let Some(module) = args.get(i + 1) {
                return format!("python -m {module}");
            }
        }
        if let Some(script) = args.iter().skip(1).find(|a| !a.starts_with('-')) {
            return format!("python {}", base(script));
        }
        return "python".into();
    }
    comm.to_string()
}

#[derive(Debug, Clone, Default)]
struct Counters {
    /// Per CPU: (busy jiffies, total jiffies, iowait jiffies).
    cpus: Vec<(u64, u64, u64)>,
    disk_read_sectors: u64,
    disk_write_sectors: u64,
    /// Per disk: milliseconds spent doing I/O.
    disk_io_ms: Vec<u64>,
    net_rx: u64,
    net_tx: u64,
}

/// Each CPU's jiffies so far (USER_HZ, 100 a second), by CPU number, from /proc/stat's
/// `cpuN` lines: (busy: user, nice, system, irq and softirq; total, steal included; iowait).
/// Empty if it cannot be read.
pub fn cpu_jiffies() -> Vec<(u64, u64, u64)> {
    cpu_jiffies_of(&std::fs::read_to_string("/proc/stat").unwrap_or_default())
}

fn cpu_jiffies_of(stat: &str) -> Vec<(u64, u64, u64)> {
    let mut cpus = Vec::new();
    for line in stat.lines().filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(|b| b.is_ascii_digit())) {
        let v: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap_or(0)).collect();
        // user nice system idle iowait irq softirq steal (guest is inside user).
        let field = |i: usize| v.get(i).copied().unwrap_or(0);
        let busy = field(0) + field(1) + field(2) + field(5) + field(6);
        cpus.push((busy, v.iter().take(8).sum(), field(4)));
    }
    cpus
}

fn read_counters() -> Counters {
    let mut c = Counters { cpus: cpu_jiffies(), ..Counters::default() };
    if let Ok(disks) = std::fs::read_to_string("/proc/diskstats") {
        for line in disks.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 14 {
                continue;
            }
            let name = f[2];
            // Whole physical disks only (partitions would count twice; loop and ram are not disks).
            let partition = std::path::Path::new(&format!("/sys/class/block/{name}/partition")).exists();
            if name.starts_with("loop") || name.starts_with("ram") || name.starts_with("dm-") || partition {
                continue;
            }
            c.disk_read_sectors += f[5].parse::<u64>().unwrap_or(0);
            c.disk_write_sectors += f[9].parse::<u64>().unwrap_or(0);
            c.disk_io_ms.push(f[12].parse().unwrap_or(0));
        }
    }
    if let Ok(net) = std::fs::read_to_string("/proc/net/dev") {
        for line in net.lines().skip(2) {
            let Some((_, rest)) = line.split_once(':') else {
                continue;
            };
            let v: Vec<u64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            if v.len() >= 9 {
                c.net_rx += v[0];
                c.net_tx += v[8];
            }
        }
    }
    c
}

fn meminfo() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let get = |key: &str| {
        text.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            * 1024
    };
    let total = get("MemTotal:");
    (total.saturating_sub(get("MemAvailable:")), total)
}

fn sample(prev: &Counters, now: &Counters, secs: f64, t: f64, sut_pss: Option<u64>) -> Sample {
    let cpu_busy = now
        .cpus
        .iter()
        .zip(&prev.cpus)
        .map(|(n, p)| {
            let total = n.1.saturating_sub(p.1);
            if total == 0 {
                0.0
            } else {
                n.0.saturating_sub(p.0) as f64 / total as f64
            }
        })
        .collect();
    let (io, tot) =
        now.cpus.iter().zip(&prev.cpus).fold((0, 0), |(io, tot), (n, p)| (io + n.2.saturating_sub(p.2), tot + n.1.saturating_sub(p.1)));
    let (used, total) = meminfo();
    let util = now.disk_io_ms.iter().zip(&prev.disk_io_ms).map(|(n, p)| n.saturating_sub(*p) as f64 / (secs * 1000.0)).fold(0.0, f64::max);
    let rate = |n: u64, p: u64| n.saturating_sub(p) as f64 / secs;
    Sample {
        t,
        cpu_busy,
        cpu_iowait: if tot == 0 { 0.0 } else { io as f64 / tot as f64 },
        mem_used_bytes: used,
        mem_total_bytes: total,
        disk_read_bytes_per_s: rate(now.disk_read_sectors, prev.disk_read_sectors) * 512.0,
        disk_write_bytes_per_s: rate(now.disk_write_sectors, prev.disk_write_sectors) * 512.0,
        disk_util: util.min(1.0),
        net_rx_bytes_per_s: rate(now.net_rx, prev.net_rx),
        net_tx_bytes_per_s: rate(now.net_tx, prev.net_tx),
        sut_pss_bytes: sut_pss,
        sut_pss_by_kind: None,
    }
}

/// What a sampler gathered: its samples, and the deployment's CPU-seconds by kind of process.
pub type Sampled = (Vec<Sample>, BTreeMap<String, f64>);

/// Samples on a thread of its own until stopped.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Sampled>>,
}

impl Sampler {
    /// Sample every `interval` (and `sut`'s processes), on a thread pinned to `cpu` when
    /// given — the load's CPU: reading every process's smaps each second is work that must
    /// not land on the deployment's CPUs.
    pub fn start(interval: Duration, sut: Option<SutProcesses>, cpu: Option<usize>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            if let Some(cpu) = cpu {
                let _ = sprout_runtime::pin_to(cpu);
            }
            let begin = Instant::now();
            let mut samples = Vec::new();
            let mut processes = ProcessCpu::default();
            if let Some(sut) = &sut {
                processes.look(&sut.pids());
            }
            let mut prev = read_counters();
            let mut prev_at = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                let next = prev_at + interval;
                while Instant::now() < next && !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50).min(next.saturating_duration_since(Instant::now())));
                }
                let now = read_counters();
                let secs = prev_at.elapsed().as_secs_f64();
                // The deployment's processes, listed once for both their memory and their CPU.
                let pids = sut.as_ref().map(SutProcesses::pids);
                if let Some(pids) = &pids {
                    processes.look(pids);
                }
                if secs > 0.05 {
                    let pss = pids.as_deref().map(pss_each);
                    let total = pss.as_ref().map(|each| each.iter().map(|(_, bytes)| bytes).sum());
                    let mut s = sample(&prev, &now, secs, begin.elapsed().as_secs_f64(), total);
                    s.sut_pss_by_kind = pss.map(|each| processes.by_kind(&each));
                    samples.push(s);
                }
                prev = now;
                prev_at = Instant::now();
            }
            (samples, processes.seconds_by_kind())
        });
        Sampler { stop, thread: Some(thread) }
    }

    /// The samples, and the deployment's CPU-seconds by kind of process (empty without one).
    pub fn stop(mut self) -> Sampled {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map(|t| t.join().unwrap_or_default()).unwrap_or_default()
    }
}

/// CPU-seconds used on `cpus` and, when known, the deployment's memory in GB-seconds,
/// integrated over the samples (each sample covers the interval before it).
pub fn integrate(samples: &[Sample], cpus: &[usize]) -> (f64, Option<f64>) {
    let mut cpu_s = 0.0;
    let mut gb_s = 0.0;
    let mut have_mem = true;
    let mut prev_t = 0.0;
    for s in samples {
        let dt = s.t - prev_t;
        prev_t = s.t;
        cpu_s += cpus.iter().filter_map(|c| s.cpu_busy.get(*c)).sum::<f64>() * dt;
        match s.sut_pss_bytes {
            Some(b) => gb_s += b as f64 / 1e9 * dt,
            None => have_mem = false,
        }
    }
    (cpu_s, have_mem.then_some(gb_s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_jiffies_are_read_per_cpu_from_proc_stat() {
        let stat = "cpu  100 0 50 900 0 0 0 0 0 0\ncpu0 10 1 5 400 7 2 3 9 0 0\ncpu1 90 0 45 500 0 0 0 0 0 0\nintr 1 2\n";
        // user + nice + system + irq + softirq; idle, iowait and steal are not busy.
        assert_eq!(cpu_jiffies_of(stat), vec![(21, 437, 7), (135, 635, 0)]);
    }

    #[test]
    fn a_busy_thread_shows_on_its_cpu() {
        // Spin on CPU 0 for a second while sampling: CPU 0 reads mostly busy.
        let sampler = Sampler::start(Duration::from_millis(250), Some(SutProcesses(PathBuf::from("/nonexistent"))), None);
        let spin = std::thread::spawn(|| {
            let _ = sprout_runtime::pin_to(0);
            let end = Instant::now() + Duration::from_millis(1100);
            let mut x = 0u64;
            while Instant::now() < end {
                x = x.wrapping_add(1);
            }
            x
        });
        spin.join().unwrap();
        let (samples, by_process) = sampler.stop();
        assert!(by_process.is_empty(), "{by_process:?}");
        assert!(samples.len() >= 3, "{samples:?}");
        let busiest = samples.iter().map(|s| s.cpu_busy[0]).fold(0.0, f64::max);
        assert!(busiest > 0.8, "{samples:?}");
        assert!(samples[0].mem_total_bytes > 0 && samples[0].mem_used_bytes > 0);
        assert_eq!(samples[0].sut_pss_bytes, Some(0));
        let (cpu_s, gb_s) = integrate(&samples, &[0]);
        assert!(cpu_s > 0.7, "{cpu_s}");
        assert_eq!(gb_s, Some(0.0));
    }

    #[test]
    fn cpu_time_is_charged_to_the_deployments_processes_by_kind() {
        // A stand-in cgroup listing this test process: a thread spinning until it has had
        // 600 ms of CPU shows as about that much CPU time, under this process's kind. (CPU
        // time, not wall time: on a loaded machine 600 ms of wall time may get far less.)
        let dir = std::env::temp_dir().join(format!("sprout-load-cg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), format!("{}\n", std::process::id())).unwrap();
        let sampler = Sampler::start(Duration::from_millis(100), Some(SutProcesses(dir.clone())), None);
        std::thread::sleep(Duration::from_millis(150));
        let thread_cpu = || {
            let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: clock_gettime writes one timespec, which `t` is, and keeps no pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
            Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
        };
        let (start, give_up) = (thread_cpu(), Instant::now() + Duration::from_secs(20));
        let mut x = 0u64;
        while thread_cpu() - start < Duration::from_millis(600) && Instant::now() < give_up {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        std::thread::sleep(Duration::from_millis(250));
        let (samples, by_process) = sampler.stop();
        std::fs::remove_dir_all(&dir).unwrap();
        let total: f64 = by_process.values().sum();
        assert!(x > 0 && (0.5..3.0).contains(&total), "{by_process:?}");
        assert_eq!(by_process.len(), 1, "{by_process:?}");
        // Its memory shows under the same kind, and adds up to the total.
        let kind = by_process.keys().next().unwrap();
        let last = samples.last().unwrap();
        let by_kind = last.sut_pss_by_kind.as_ref().unwrap();
        assert!(by_kind[kind] > 1_000_000, "{by_kind:?}");
        assert_eq!(by_kind.values().sum::<u64>(), last.sut_pss_bytes.unwrap());
    }

    #[test]
    fn a_cgroups_pss_is_its_processes() {
        let dir = std::env::temp_dir().join(format!("sprout-load-pss-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("child")).unwrap();
        std::fs::write(dir.join("child/cgroup.procs"), format!("{}\n", std::process::id())).unwrap();
        let pss = pss_of_cgroup(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(pss > 1_000_000, "{pss}");
        assert_eq!(pss_of_cgroup(std::path::Path::new("/nonexistent")), 0);
    }

    #[test]
    fn processes_are_named_by_what_they_run() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(process_kind("postgres", &args(&["postgres: olio olio 127.0.0.1(5) idle"])), "postgres: backend");
        assert_eq!(process_kind("postgres", &args(&["postgres: autovacuum worker   "])), "postgres: autovacuum worker");
        assert_eq!(process_kind("postgres", &args(&["/usr/lib/postgresql/15/bin/postgres", "-D", "/x"])), "postgres");
        assert_eq!(process_kind("sprout", &args(&["/x/sprout", "worker", "up"])), "sprout worker");
        assert_eq!(process_kind("python3", &args(&["/usr/bin/python3", "-m", "gunicorn", "-c", "g.py"])), "python -m gunicorn");
        assert_eq!(process_kind("python3", &args(&["python3", "-u", "/srv/zygote.py"])), "python zygote.py");
        assert_eq!(process_kind("nginx", &args(&["nginx: worker process"])), "nginx");
    }

    #[test]
    fn integration_of_known_samples() {
        let s = |t: f64, busy: f64, pss: u64| Sample {
            t,
            cpu_busy: vec![busy, 1.0],
            cpu_iowait: 0.0,
            mem_used_bytes: 0,
            mem_total_bytes: 0,
            disk_read_bytes_per_s: 0.0,
            disk_write_bytes_per_s: 0.0,
            disk_util: 0.0,
            net_rx_bytes_per_s: 0.0,
            net_tx_bytes_per_s: 0.0,
            sut_pss_bytes: Some(pss),
            sut_pss_by_kind: None,
        };
        let samples = [s(1.0, 0.5, 1_000_000_000), s(3.0, 0.25, 2_000_000_000)];
        let (cpu, gb) = integrate(&samples, &[0]);
        assert!((cpu - (0.5 + 0.5)).abs() < 1e-12);
        assert!((gb.unwrap() - (1.0 + 4.0)).abs() < 1e-12);
    }
}
