//! Unit tests of the simulated backend: the event seam and partial AICPU-thread start retries.
use super::*;
use crate::backend::EventState;

/// An event another backend recorded.
#[derive(Debug)]
struct ForeignEvent;

impl EventState for ForeignEvent {
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

#[test]
fn events_go_through_the_backend_seam_and_a_foreign_event_is_refused() {
    let mut dev = SimDevice::new(0, SimOptions::default());
    let ev = dev.record_event(StreamKind::Aicpu).unwrap();
    let op = Duration::from_secs(5);
    assert_eq!(dev.event_synchronize(&ev, Duration::from_secs(5), op), Ok(()));
    assert_eq!(dev.event_status(&ev, op), EventStatus::Complete);
    assert_eq!(dev.wait_event(StreamKind::AiCore, &ev), Ok(()));
    let foreign: EventHandle = Arc::new(ForeignEvent);
    assert_eq!(
        dev.wait_event(StreamKind::AiCore, &foreign).map_err(|f| f.code),
        Err(AclCode::INTERNAL_ERROR)
    );
    assert!(matches!(dev.event_status(&foreign, op), EventStatus::Failed(_)));
    assert!(
        dev.synchronize(StreamKind::AiCore, Duration::from_secs(5), Duration::from_secs(5)).is_ok()
    );
    assert!(dev.shutdown_within(Duration::from_secs(10)).is_empty());
}

#[test]
fn a_retried_aicpu_start_after_a_partial_spawn_failure_starts_only_the_missing_threads() {
    let mut dev = SimDevice::new(0, SimOptions::default());
    dev.spawn_budget = Some(2);
    let err = dev.start_aicpu_threads().unwrap_err();
    assert!(matches!(err, InitFailure::ThreadSpawn { thread: 2, .. }), "{err:?}");
    assert_eq!(
        std::error::Error::source(&err).map(|e| e.to_string()).as_deref(),
        Some("injected spawn failure")
    );
    assert_eq!(Backend::thread_stats(&dev).spawned, 2);
    dev.spawn_budget = None;
    dev.start_aicpu_threads().unwrap();
    let names: Vec<&str> = dev.threads.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["sim0-aicpu0", "sim0-aicpu1", "sim0-aicpu2", "sim0-aicpu3"]);
    dev.start_aicpu_threads().unwrap();
    assert_eq!(Backend::thread_stats(&dev).spawned, MAX_AICPU_THREADS);
    assert!(dev.shutdown_within(Duration::from_secs(10)).is_empty());
}

#[test]
fn a_job_posted_after_quit_does_not_take_its_place() {
    // A queued launch can start its entry on a thread after the shutdown told it to quit.
    let dev = SimDevice::new(0, SimOptions::default());
    let shared = &*dev.shared;
    shared.post(Role::Aicpu, 0, Mail::Quit);
    let entry = stream::LaunchEntry::new(stream::EntryKind::Aicpu { threads: 1 }, 0);
    shared.post(Role::Aicpu, 0, Mail::Job { stream: 0, entry, brief: 0 });
    assert!(matches!(*shared.mailbox(Role::Aicpu, 0).state.lock(), Mail::Quit));
}

#[test]
fn an_aicore_launch_of_no_cores_or_too_many_is_refused_not_left_running() {
    let mut dev = SimDevice::new(0, SimOptions::default());
    for block_dim in [0, MAX_LAUNCH_CORES as u32 / 3 + 1, u32::MAX / 2] {
        assert_eq!(
            dev.launch_aicore(block_dim, 0).err().map(|f| f.code),
            Some(AclCode::LAUNCH_FAILED)
        );
    }
    let op = Duration::from_secs(1);
    assert_eq!(dev.synchronize(StreamKind::AiCore, Duration::from_millis(200), op), Ok(()));
    assert!(dev.shutdown_within(Duration::from_secs(10)).is_empty());
}
