//! The instance manager against the fake back-end: reuse, capacity, queueing, a sandbox dying
//! mid-request, failed creates, eviction, and pausing — without root or a Python.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sprout_sandbox::channel::Request;
use sprout_sandbox::{Calls, CreateError, InvokeError, Limits, Phase, PlatformError};

use super::fake::{Event, FakeBackend, Outcome, PlainSpecs};
use super::{Failure, InstanceConfig, Instances, Invocation, SandboxState};
use crate::handler_cache::{Eviction, HandlerCacheConfig};
use crate::registry::Lambda;
use crate::retry::Reason;

struct NoCalls;

#[async_trait]
impl Calls for NoCalls {
    async fn call(&self, _lambda: &str, _event: Bytes, _batch: bool, _time_left: Duration) -> (serde_json::Value, Bytes) {
        (serde_json::json!({"status": 404}), Bytes::new())
    }
}

fn config() -> InstanceConfig {
    InstanceConfig {
        keep_warm: true,
        start_on_deploy: false,
        idle_timeout: Duration::from_secs(600),
        keep_alive: None,
        max_per_lambda: 4,
        queue_depth: 4,
        max_total: 8,
        timeout: Duration::from_secs(5),
        limits: Limits { memory_bytes: 64 << 20, pids: 64, cpus: 0.0 },
        handler_cache: HandlerCacheConfig { pause: false, pause_after: Duration::from_millis(10), memory_limit: 1 << 30 },
        budget: None,
        sandbox_estimate: 32 << 20,
        lambda_cpu_weight: 100,
        cpu_weight_split: true,
        long_request: None,
        preempt_tick: None,
        rt_home: None,
    }
}

fn start(cfg: InstanceConfig) -> (Arc<FakeBackend>, Arc<Instances>) {
    let backend = Arc::new(FakeBackend::default());
    let instances = Instances::new(backend.clone(), Arc::new(PlainSpecs), cfg, crate::logs::Logs::in_memory());
    (backend, instances)
}

/// Instances that pause idle sandboxes, over a back-end whose sandboxes can be paused.
fn start_pausing(mut cfg: InstanceConfig) -> (Arc<FakeBackend>, Arc<Instances>) {
    cfg.handler_cache.pause = true;
    let (backend, instances) = start(cfg);
    backend.script.lock().unwrap().pausable = true;
    (backend, instances)
}

fn tag() -> crate::logs::RequestTag {
    crate::logs::RequestTag { id: Arc::from("test"), trigger: crate::logs::Trigger::Http }
}

fn request(method: &str) -> Request {
    Request {
        method: method.into(),
        script_name: "/run/f".into(),
        path: "/".into(),
        query: String::new(),
        headers: Vec::new(),
        protocol: "HTTP/1.1".into(),
        remote_addr: "127.0.0.1".into(),
        depth: 0,
        request_id: String::new(),
        batch: false,
    }
}

async fn call(instances: &Instances, lambda: &Arc<Lambda>, method: &str) -> Result<Invocation, Failure> {
    instances.invoke(lambda, &request(method), b"", instances.timeout(), &NoCalls, &tag()).await
}

/// Wait until `cond` holds (background destruction and pausing take a moment), up to 5 s.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn idle(instances: &Instances) -> i64 {
    instances.figures().in_state(SandboxState::Idle)
}

#[tokio::test]
async fn an_idle_sandbox_serves_the_next_request_warm() {
    let (backend, instances) = start(config());
    let f = Lambda::fake("f", 1);
    let first = call(&instances, &f, "GET").await.unwrap();
    let second = call(&instances, &f, "GET").await.unwrap();
    assert!(first.cold && !second.cold);
    assert_eq!(first.sandbox, second.sandbox);
    assert_eq!(backend.count(Event::Created), 1);
    assert_eq!((idle(&instances), instances.figures().in_state(SandboxState::Busy)), (1, 0));
}

/// The histogram keep-alive policy in bins of `bin_ms` over 2 s, trusted after 3 idle times,
/// with an hour while young.
fn histogram(bin_ms: u64) -> InstanceConfig {
    let policy = crate::keepalive::Policy {
        bin: Duration::from_millis(bin_ms),
        range: Duration::from_secs(2),
        min_samples: 3,
        fixed_keep_alive: Duration::from_secs(3600),
        ..Default::default()
    };
    InstanceConfig { keep_alive: Some(policy), idle_timeout: Duration::from_secs(3600), ..config() }
}

#[tokio::test]
async fn idle_sandboxes_are_kept_for_the_window_their_lambdas_idle_times_give() {
    // A lambda called every 100 ms: its window (whole 50 ms bins) is 0.2 s; one called once
    // has too few idle times and keeps the fixed hour.
    let (_backend, instances) = start(histogram(50));
    let (f, g) = (Lambda::fake("f", 1), Lambda::fake("g", 1));
    call(&instances, &g, "GET").await.unwrap();
    for _ in 0..5 {
        call(&instances, &f, "GET").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = instances.stats();
    let window = &stats["per_lambda"]["f"]["keep_alive"];
    assert_eq!((window["basis"].as_str(), window["idle_times"].as_u64()), (Some("histogram"), Some(4)), "{window}");
    assert_eq!(stats["per_lambda"]["g"]["keep_alive"]["basis"], "young");
    until("f's idle sandbox reaped after its window", || instances.stats()["per_lambda"].get("f").is_none()).await;
    assert_eq!(instances.stats()["per_lambda"]["g"]["idle"], 1, "g's is kept for the fixed window");
}

#[tokio::test]
async fn with_a_prewarm_window_the_sandbox_goes_after_each_request_and_a_new_one_waits_for_the_next() {
    // Called every 600 ms: idle times of about 600 ms, all in one 100 ms bin, so the policy
    // says pre-warm 500 ms after each invocation and keep that sandbox for 300 ms.
    let (backend, instances) = start(histogram(100));
    let f = Lambda::fake("f", 1);
    for _ in 0..4 {
        call(&instances, &f, "GET").await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    let window = instances.stats()["per_lambda"]["f"]["keep_alive"].clone();
    assert_eq!((window["prewarm_s"].as_f64(), window["keep_alive_s"].as_f64()), (Some(0.5), Some(0.3)), "{window}");
    // Trained: this request's sandbox goes right after it...
    let (created, destroyed) = (backend.count(Event::Created), backend.count(Event::Destroyed));
    let made = instances.stats()["prewarms"]["made"].as_u64().unwrap();
    let served = call(&instances, &f, "GET").await.unwrap();
    until("the sandbox unloaded after its request", || backend.count(Event::Destroyed) > destroyed).await;
    assert_eq!(idle(&instances), 0);
    // ...a new one is started 500 ms on, and serves the next request, 600 ms on, warm.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let next = call(&instances, &f, "GET").await.unwrap();
    assert!(!next.cold && next.sandbox != served.sandbox, "served by the pre-warmed sandbox");
    assert_eq!(backend.count(Event::Created), created + 1);
    assert_eq!(instances.stats()["prewarms"]["made"].as_u64(), Some(made + 1));
    // Unused, a pre-warmed sandbox goes after its keep-alive window.
    until("the next pre-warmed sandbox is made", || instances.stats()["prewarms"]["made"].as_u64() == Some(made + 2)).await;
    until("and reaped, unused, after its window", || instances.stats()["per_lambda"].get("f").is_none()).await;
}

#[tokio::test]
async fn a_lambda_that_does_not_reuse_sandboxes_gets_a_fresh_one_per_request() {
    let (backend, instances) = start(config());
    let config = crate::registry::lambda_config::LambdaConfig { reuse_sandbox: false, ..Default::default() };
    let f = Lambda::fake_with("f", 1, config);
    let first = call(&instances, &f, "GET").await.unwrap();
    let second = call(&instances, &f, "GET").await.unwrap();
    assert!(first.cold && second.cold && first.sandbox != second.sandbox);
    until("both destroyed", || backend.count(Event::Destroyed) == 2).await;
    assert_eq!((idle(&instances), backend.count(Event::Created)), (0, 2));
}

#[tokio::test]
async fn concurrent_requests_beyond_the_lambdas_limit_queue_and_overflow_is_refused() {
    let (backend, instances) = start(InstanceConfig { max_per_lambda: 1, queue_depth: 1, ..config() });
    let f = Lambda::fake("f", 1);
    backend.script.lock().unwrap().outcomes.push_back(Outcome::Slow(Duration::from_millis(200)));
    let (a, b, c) = tokio::join!(call(&instances, &f, "GET"), call(&instances, &f, "GET"), call(&instances, &f, "GET"));
    let results = [a, b, c];
    let full = results.iter().filter(|r| matches!(r, Err(Failure::QueueFull(1)))).count();
    let served: Vec<u64> = results.iter().filter_map(|r| r.as_ref().ok().map(|i| i.sandbox)).collect();
    assert_eq!(full, 1, "one request finds the queue full");
    assert_eq!(served.len(), 2);
    assert_eq!(served[0], served[1], "the queued request is handed the one sandbox");
    assert_eq!(backend.count(Event::Created), 1);
}

#[tokio::test]
async fn a_request_that_waits_too_long_gives_up_and_loses_no_sandbox() {
    let (backend, instances) = start(InstanceConfig { max_per_lambda: 1, ..config() });
    let f = Lambda::fake("f", 1);
    backend.script.lock().unwrap().outcomes.push_back(Outcome::Slow(Duration::from_millis(150)));
    let get = request("GET");
    let tag = tag();
    let impatient = instances.invoke(&f, &get, b"", Duration::from_millis(30), &NoCalls, &tag);
    let (slow, impatient) = tokio::join!(call(&instances, &f, "GET"), impatient);
    assert!(slow.is_ok());
    assert!(matches!(impatient, Err(Failure::QueueTimeout(_))));
    let after = call(&instances, &f, "GET").await.unwrap();
    assert!(!after.cold, "the sandbox went idle, not astray");
    assert_eq!(backend.count(Event::Created), 1);
}

#[tokio::test]
async fn a_safe_request_whose_sandbox_dies_before_answering_runs_on_another() {
    let (backend, instances) = start(config());
    let f = Lambda::fake("f", 1);
    backend.script.lock().unwrap().outcomes.push_back(Outcome::Crash(Phase::AwaitingReply));
    let done = call(&instances, &f, "GET").await.unwrap();
    until("the dead sandbox is destroyed", || backend.events().contains(&Event::Destroyed(1))).await;
    assert_eq!(backend.count(Event::Created), 2);
    assert_eq!(done.sandbox, 2);
    assert_eq!(instances.figures().retries(Reason::NoReply), 1);
}

#[tokio::test]
async fn a_crash_after_the_reply_began_or_of_an_unsafe_request_is_not_run_again() {
    let (backend, instances) = start(config());
    let f = Lambda::fake("f", 1);
    backend.script.lock().unwrap().outcomes.extend([Outcome::Crash(Phase::Replying), Outcome::Crash(Phase::Sending)]);
    let replying = call(&instances, &f, "GET").await;
    assert!(matches!(replying, Err(Failure::Sandbox(InvokeError::Crashed { phase: Phase::Replying, .. }))));
    let post = call(&instances, &f, "POST").await;
    assert!(matches!(post, Err(Failure::Sandbox(InvokeError::Crashed { phase: Phase::Sending, .. }))));
    assert_eq!(backend.count(Event::Invoked), 2, "neither ran twice");
    assert_eq!(instances.figures().retries(Reason::SendFailed) + instances.figures().retries(Reason::NoReply), 0);
}

#[tokio::test]
async fn a_timed_out_sandbox_is_destroyed_not_reused() {
    let (backend, instances) = start(config());
    let f = Lambda::fake("f", 1);
    backend.script.lock().unwrap().outcomes.push_back(Outcome::Timeout);
    assert!(matches!(call(&instances, &f, "GET").await, Err(Failure::Sandbox(InvokeError::Timeout(_)))));
    let next = call(&instances, &f, "GET").await.unwrap();
    assert!(next.cold);
    until("the timed-out sandbox is destroyed", || backend.events().contains(&Event::Destroyed(1))).await;
}

#[tokio::test]
async fn a_failed_create_gives_its_room_back() {
    let (backend, instances) = start(InstanceConfig { max_per_lambda: 1, max_total: 1, ..config() });
    let f = Lambda::fake("f", 1);
    backend.script.lock().unwrap().create_errors.extend([
        CreateError::Load { message: "ImportError: no module named nope".into(), traceback: None },
        CreateError::Platform(PlatformError::io("taking a cgroup from the pool", std::io::Error::other("no cgroup"))),
    ]);
    assert!(matches!(call(&instances, &f, "GET").await, Err(Failure::Load { .. })));
    assert!(matches!(call(&instances, &f, "GET").await, Err(Failure::Platform(_))));
    assert!(call(&instances, &f, "GET").await.unwrap().cold, "room for the one sandbox is free again");
    assert_eq!(instances.stats()["total_sandboxes"], 1);
}

#[tokio::test]
async fn a_full_worker_evicts_the_least_recently_used_idle_sandbox() {
    let (backend, instances) = start(InstanceConfig { max_total: 2, ..config() });
    let (a, b, c) = (Lambda::fake("a", 1), Lambda::fake("b", 1), Lambda::fake("c", 1));
    let on_a = call(&instances, &a, "GET").await.unwrap().sandbox;
    call(&instances, &b, "GET").await.unwrap();
    call(&instances, &c, "GET").await.unwrap();
    until("a's sandbox, the oldest idle, is evicted", || backend.events().contains(&Event::Destroyed(on_a))).await;
    assert_eq!(instances.cache_figures().2.iter().find(|(why, _)| *why == Eviction::Room.label()).map(|e| e.1), Some(1));
    assert_eq!(instances.stats()["total_sandboxes"], 2);
}

#[tokio::test]
async fn an_idle_sandbox_is_paused_then_resumed_for_the_next_request() {
    let (backend, instances) = start_pausing(config());
    let f = Lambda::fake("f", 1);
    let id = call(&instances, &f, "GET").await.unwrap().sandbox;
    until("the idle sandbox is paused", || instances.cache_figures().0 == 1).await;
    call(&instances, &f, "GET").await.unwrap();
    let events = backend.events();
    let at = |e: Event| events.iter().position(|x| *x == e).unwrap_or_else(|| panic!("no {e:?} in {events:?}"));
    assert!(at(Event::Paused(id)) < at(Event::Resumed(id)));
    assert_eq!(events.last(), Some(&Event::Invoked(id)), "resumed before it was invoked");
}

#[tokio::test]
async fn a_sandbox_reused_before_its_pause_is_due_is_paused_only_after_its_last_request() {
    let mut cfg = config();
    cfg.handler_cache.pause_after = Duration::from_millis(300);
    let (backend, instances) = start_pausing(cfg);
    let f = Lambda::fake("f", 1);
    call(&instances, &f, "GET").await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    call(&instances, &f, "GET").await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(backend.count(Event::Paused), 0, "the first pause came due while it had been idle only 150 ms");
    until("the pause after the last request", || backend.count(Event::Paused) == 1).await;
}

#[tokio::test]
async fn a_sandbox_killed_while_paused_is_replaced_not_resumed_into_a_request() {
    let (backend, instances) = start_pausing(config());
    let f = Lambda::fake("f", 1);
    let id = call(&instances, &f, "GET").await.unwrap().sandbox;
    until("the idle sandbox is paused", || instances.cache_figures().0 == 1).await;
    backend.script.lock().unwrap().killed.push(id);
    let next = call(&instances, &f, "GET").await.unwrap();
    assert!(next.cold && next.sandbox != id);
    until("the killed sandbox is destroyed", || backend.events().contains(&Event::Destroyed(id))).await;
    assert_eq!(instances.cache_figures().2.iter().find(|(why, _)| *why == Eviction::Dead.label()).map(|e| e.1), Some(1));
}

#[tokio::test]
async fn a_replaced_lambdas_idle_sandboxes_are_not_reused() {
    let (backend, instances) = start(config());
    let v1 = Lambda::fake("f", 1);
    let old = call(&instances, &v1, "GET").await.unwrap().sandbox;
    v1.replaced();
    let v2 = Lambda::fake("f", 2);
    let new = call(&instances, &v2, "GET").await.unwrap();
    assert!(new.cold && new.sandbox != old);
    until("the old version's sandbox is destroyed", || backend.events().contains(&Event::Destroyed(old))).await;
    assert_eq!(instances.stats()["total_sandboxes"], 1);
}

#[tokio::test]
async fn without_keep_warm_every_sandbox_is_destroyed_after_its_request() {
    let (backend, instances) = start(InstanceConfig { keep_warm: false, ..config() });
    let f = Lambda::fake("f", 1);
    assert!(call(&instances, &f, "GET").await.unwrap().cold);
    assert!(call(&instances, &f, "GET").await.unwrap().cold);
    until("both sandboxes are destroyed", || backend.count(Event::Destroyed) == 2).await;
    assert_eq!(instances.stats()["total_sandboxes"], 0);
}

#[tokio::test]
async fn shutdown_destroys_the_idle_and_refuses_new_requests() {
    let (backend, instances) = start(config());
    let f = Lambda::fake("f", 1);
    call(&instances, &f, "GET").await.unwrap();
    instances.shutdown().await;
    assert_eq!(backend.count(Event::Destroyed), 1);
    assert!(matches!(call(&instances, &f, "GET").await, Err(Failure::ShuttingDown)));
    assert_eq!(idle(&instances), 0);
}

#[tokio::test]
async fn a_held_sandbox_serves_its_holder_alone_is_never_reaped_and_is_destroyed_when_let_go() {
    let cfg =
        InstanceConfig { max_per_lambda: 2, idle_timeout: Duration::from_millis(10), timeout: Duration::from_millis(300), ..config() };
    let (backend, instances) = start(cfg);
    let f = Lambda::fake("f", 1);
    let (mut a, mut b) = (instances.hold(&f, instances.timeout()).await.unwrap(), instances.hold(&f, instances.timeout()).await.unwrap());
    async fn run_on(instances: &Instances, held: &mut super::Held) -> Result<Invocation, Failure> {
        instances.run_held(held, &request("POST"), b"", instances.timeout(), &NoCalls, &tag()).await
    }
    let first = run_on(&instances, &mut a).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await; // past the idle timeout, reaped if idle
    let again = run_on(&instances, &mut a).await.unwrap();
    assert!(first.cold && !again.cold && first.sandbox == again.sandbox, "the same sandbox, held");
    assert_ne!(run_on(&instances, &mut b).await.unwrap().sandbox, first.sandbox);
    assert_eq!((backend.count(Event::Created), backend.count(Event::Destroyed), idle(&instances)), (2, 0, 0));
    // Both held: a request of the lambda waits, and gives up.
    assert!(matches!(call(&instances, &f, "GET").await, Err(Failure::QueueTimeout(_))));
    // A held sandbox that dies is lost, destroyed, never replaced.
    backend.script.lock().unwrap().outcomes.push_back(Outcome::Crash(Phase::AwaitingReply));
    assert!(matches!(run_on(&instances, &mut b).await, Err(Failure::Sandbox(_))));
    assert!(b.is_lost() && !a.is_lost());
    until("the dead one destroyed", || backend.count(Event::Destroyed) == 1).await;
    // Let go, a held sandbox is destroyed, not kept idle, and its room serves others.
    drop(a);
    until("the let-go one destroyed", || backend.count(Event::Destroyed) == 2).await;
    assert_eq!(idle(&instances), 0);
    assert!(call(&instances, &f, "GET").await.unwrap().cold);
    drop(b);
}

#[tokio::test]
async fn a_lambda_started_on_deploy_serves_its_first_request_warm_and_one_with_a_sandbox_gets_none() {
    let (backend, instances) = start(InstanceConfig { start_on_deploy: true, ..config() });
    let (f, g) = (Lambda::fake("f", 1), Lambda::fake("g", 1));
    instances.arrived(f.clone());
    instances.arrived(g.clone());
    let started = |field: &str| instances.stats()["started_on_deploy"][field].as_u64();
    until("both started and left idle", || started("made") == Some(2) && started("pending") == Some(0)).await;
    assert_eq!((backend.count(Event::Created), idle(&instances)), (2, 2));
    let first = call(&instances, &f, "GET").await.unwrap();
    assert!(!first.cold, "the first request found the sandbox started on deploy");
    // Arriving again (the same version, from the fleet's registry): it has a sandbox already.
    instances.arrived(f.clone());
    until("skipped", || started("skipped") == Some(1)).await;
    assert_eq!(backend.count(Event::Created), 2);
}

#[tokio::test]
async fn without_start_on_deploy_an_arriving_lambda_gets_no_sandbox() {
    let (backend, instances) = start(config());
    instances.arrived(Lambda::fake("f", 1));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(backend.count(Event::Created), 0);
    assert_eq!(instances.stats()["started_on_deploy"]["pending"].as_u64(), Some(0));
}
