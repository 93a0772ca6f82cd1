//! ACL sessions and holds against the stand-in CANN library: leases on one library share one
//! `aclInit` and one `aclFinalize`, an ACL initialised outside is never finalized, no session
//! sees ACL finalized while it lives, and a hold initialises nothing but keeps every session
//! from finalizing ACL until it ends.

use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use simpler_acl_sys::standin::{Call, FakeInstall};
use simpler_acl_sys::types::ACL_ERROR_REPEAT_INITIALIZE;
use simpler_acl_sys::{AclError, Error};

/// `func -> ret` of every call logged since the last take.
fn calls(install: &FakeInstall) -> Vec<String> {
    install.take_log().unwrap().iter().map(|c| format!("{} -> {}", c.func, c.ret)).collect()
}

fn acl_error(result: Result<impl std::fmt::Debug, Error>) -> AclError {
    match result {
        Err(Error::Acl(e)) => e,
        other => panic!("not an ACL error: {other:?}"),
    }
}

#[test]
fn overlapping_sessions_initialise_acl_once_and_finalize_it_after_the_last() {
    let install = FakeInstall::standard().unwrap();
    // Two loaders of the same library share its sessions, as ACL's state is the library's.
    let (one, two) = (install.cann(), install.cann());
    let first = one.acl_session().unwrap();
    let second = two.acl_session().unwrap();
    assert_eq!(calls(&install), ["aclInit -> 0"]);
    drop(first);
    assert_eq!(calls(&install), [""; 0], "finalized under the second session");
    assert!(install.acl_initialized().unwrap());
    let third = one.acl_session().unwrap();
    second.end().unwrap();
    assert_eq!(calls(&install), [""; 0], "finalized under the third session");
    third.end().unwrap();
    assert_eq!(calls(&install), ["aclFinalize -> 0"]);
    assert!(!install.acl_initialized().unwrap());
    // A session after the last one initialises ACL again.
    one.acl_session().unwrap().end().unwrap();
    assert_eq!(calls(&install), ["aclInit -> 0", "aclFinalize -> 0"]);
}

#[test]
fn a_session_on_acl_initialised_outside_never_finalizes_it() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    // SAFETY: a null configuration path is allowed.
    assert_eq!(unsafe { cann.aclInit(ptr::null()) }, Ok(0));
    install.take_log().unwrap();
    for _ in 0..2 {
        let first = cann.acl_session().unwrap();
        let second = cann.acl_session().unwrap();
        first.end().unwrap();
        drop(second);
        let repeat = format!("aclInit -> {ACL_ERROR_REPEAT_INITIALIZE}");
        assert_eq!(calls(&install), [repeat], "an outside ACL was finalized");
        assert!(install.acl_initialized().unwrap());
    }
    assert_eq!(cann.soc_name().unwrap().as_deref(), Some("Ascend910B1"));
    assert!(install.acl_initialized().unwrap(), "soc_name finalized an outside ACL");
}

#[test]
fn installs_have_sessions_of_their_own() {
    let (a, b) = (FakeInstall::standard().unwrap(), FakeInstall::standard().unwrap());
    let (cann_a, cann_b) = (a.cann(), b.cann());
    let session_a = cann_a.acl_session().unwrap();
    let session_b = cann_b.acl_session().unwrap();
    assert_eq!(calls(&a), ["aclInit -> 0"]);
    assert_eq!(calls(&b), ["aclInit -> 0"], "b's library counted as a's");
    session_a.end().unwrap();
    assert_eq!(calls(&a), ["aclFinalize -> 0"]);
    assert!(b.acl_initialized().unwrap());
    session_b.end().unwrap();
    assert_eq!(calls(&b), ["aclFinalize -> 0"]);
}

#[test]
fn holds_name_their_library_alike_through_every_loader_and_apart_across_installs() {
    let (a, b) = (FakeInstall::standard().unwrap(), FakeInstall::standard().unwrap());
    let (one, two) = (Arc::new(a.cann()), Arc::new(a.cann()));
    let (hold_one, hold_two) = (one.acl_hold().unwrap(), two.acl_hold().unwrap());
    let hold_b = Arc::new(b.cann()).acl_hold().unwrap();
    assert_eq!(hold_one.library(), hold_two.library(), "one library, two loaders");
    assert_ne!(hold_one.library(), hold_b.library(), "two installs taken for one library");
    for hold in [hold_one, hold_two, hold_b] {
        hold.end().unwrap();
    }
}

#[test]
fn a_failed_acl_init_is_returned_and_leaves_no_session_behind() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    install.fail_call("aclInit", 1, 507_899).unwrap();
    let e = acl_error(cann.acl_session());
    assert_eq!((e.func, e.code), ("aclInit", 507_899));
    let session = cann.acl_session().unwrap();
    session.end().unwrap();
    assert_eq!(calls(&install), ["aclInit -> 507899", "aclInit -> 0", "aclFinalize -> 0"]);
}

#[test]
fn a_failed_acl_finalize_is_returned_by_end() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    install.fail_call("aclFinalize", 1, 507_000).unwrap();
    let e = acl_error(cann.acl_session().unwrap().end());
    assert_eq!((e.func, e.code), ("aclFinalize", 507_000));
    assert!(e.recent.is_some(), "CANN's message was not captured: {e}");
    // The session ended all the same; ACL is still initialised, so the next one only uses it.
    cann.acl_session().unwrap().end().unwrap();
    let repeat = format!("aclInit -> {ACL_ERROR_REPEAT_INITIALIZE}");
    assert_eq!(calls(&install), ["aclInit -> 0", "aclFinalize -> 507000", repeat.as_str()]);
}

#[test]
fn a_hold_initialises_nothing_and_keeps_a_session_from_finalizing_acl_under_it() {
    let install = FakeInstall::standard().unwrap();
    let cann = Arc::new(install.cann());
    // A hold alone calls nothing, and ending it finalizes nothing it did not initialise.
    cann.acl_hold().unwrap().end().unwrap();
    assert_eq!(calls(&install), [""; 0]);
    let hold = cann.acl_hold().unwrap();
    assert_eq!(calls(&install), [""; 0], "a hold called ACL");
    // A session under a hold initialises ACL, as the hold did not.
    cann.acl_session().unwrap().end().unwrap();
    assert_eq!(calls(&install), ["aclInit -> 0"], "finalized under the hold");
    assert!(install.acl_initialized().unwrap());
    // A later session counts itself in; so does a query of the SoC name.
    cann.acl_session().unwrap().end().unwrap();
    assert_eq!(cann.soc_name().unwrap().as_deref(), Some("Ascend910B1"));
    assert_eq!(calls(&install), ["aclrtGetSocName -> 0"]);
    // The hold ends last: it finalizes the ACL the first session initialised.
    hold.end().unwrap();
    assert_eq!(calls(&install), ["aclFinalize -> 0"]);
    assert!(!install.acl_initialized().unwrap());
}

#[test]
fn a_hold_on_acl_initialised_outside_never_finalizes_it() {
    let install = FakeInstall::standard().unwrap();
    let cann = Arc::new(install.cann());
    let hold = cann.acl_hold().unwrap();
    // SAFETY: a null configuration path is allowed.
    assert_eq!(unsafe { cann.aclInit(ptr::null()) }, Ok(0));
    cann.acl_session().unwrap().end().unwrap();
    drop(hold);
    let repeat = format!("aclInit -> {ACL_ERROR_REPEAT_INITIALIZE}");
    assert_eq!(calls(&install), ["aclInit -> 0", repeat.as_str()], "an outside ACL was finalized");
    assert!(install.acl_initialized().unwrap());
}

#[test]
fn a_failed_acl_init_under_a_hold_leaves_acl_to_the_next_session() {
    let install = FakeInstall::standard().unwrap();
    let cann = Arc::new(install.cann());
    let hold = cann.acl_hold().unwrap();
    install.fail_call("aclInit", 1, 507_899).unwrap();
    let e = acl_error(cann.acl_session());
    assert_eq!((e.func, e.code), ("aclInit", 507_899));
    // The entry did not take ACL for initialised: the next session calls aclInit again.
    cann.acl_session().unwrap().end().unwrap();
    hold.end().unwrap();
    assert_eq!(calls(&install), ["aclInit -> 507899", "aclInit -> 0", "aclFinalize -> 0"]);
}

#[test]
fn under_a_hold_an_outside_acl_finalized_by_its_owner_is_initialised_again_by_the_next_session() {
    let install = FakeInstall::standard().unwrap();
    let cann = Arc::new(install.cann());
    let hold = cann.acl_hold().unwrap();
    // SAFETY: a null configuration path is allowed.
    assert_eq!(unsafe { cann.aclInit(ptr::null()) }, Ok(0));
    cann.acl_session().unwrap().end().unwrap();
    // Its owner finalizes the outside ACL while the hold lives.
    // SAFETY: no arguments.
    assert_eq!(unsafe { cann.aclFinalize() }, Ok(0));
    let session = cann.acl_session().unwrap();
    assert!(install.acl_initialized().unwrap(), "a session runs with ACL finalized");
    session.end().unwrap();
    hold.end().unwrap();
    let repeat = format!("aclInit -> {ACL_ERROR_REPEAT_INITIALIZE}");
    assert_eq!(
        calls(&install),
        ["aclInit -> 0", repeat.as_str(), "aclFinalize -> 0", "aclInit -> 0", "aclFinalize -> 0"]
    );
}

#[test]
fn a_failed_acl_finalize_is_returned_by_the_end_of_the_last_hold() {
    let install = FakeInstall::standard().unwrap();
    let cann = Arc::new(install.cann());
    let hold = cann.acl_hold().unwrap();
    cann.acl_session().unwrap().end().unwrap();
    install.fail_call("aclFinalize", 1, 507_000).unwrap();
    let e = acl_error(hold.end());
    assert_eq!((e.func, e.code), ("aclFinalize", 507_000));
    assert_eq!(Arc::strong_count(&cann), 1, "the ended hold kept its loader");
}

/// A writer for a `tracing` subscriber that keeps what is written.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What `f` returns, and what it logged.
fn logged_during<T>(f: impl FnOnce() -> T) -> (T, String) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    (out, text)
}

#[test]
fn a_soc_name_read_is_returned_when_the_finalize_after_it_fails_and_the_failure_is_logged() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    install.fail_call("aclFinalize", 1, 507_000).unwrap();
    let (name, text) = logged_during(|| cann.soc_name());
    assert_eq!(name.unwrap().as_deref(), Some("Ascend910B1"));
    assert!(text.contains("ERROR") && text.contains("aclFinalize: 507000"), "logged: {text:?}");
}

#[test]
fn a_failed_acl_finalize_of_a_dropped_hold_is_logged() {
    let install = FakeInstall::standard().unwrap();
    let cann = Arc::new(install.cann());
    let hold = cann.acl_hold().unwrap();
    cann.acl_session().unwrap().end().unwrap();
    install.fail_call("aclFinalize", 1, 507_000).unwrap();
    let ((), text) = logged_during(|| drop(hold));
    assert!(text.contains("ERROR") && text.contains("aclFinalize: 507000"), "logged: {text:?}");
}

#[test]
fn a_failed_acl_finalize_of_a_dropped_session_is_logged() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    install.fail_call("aclFinalize", 1, 507_000).unwrap();
    let ((), text) = logged_during(|| drop(cann.acl_session().unwrap()));
    assert!(text.contains("ERROR") && text.contains("aclFinalize: 507000"), "logged: {text:?}");
}

#[test]
fn sessions_and_soc_name_queries_on_eight_threads_never_see_acl_finalized_inside_a_session() {
    const THREADS: usize = 8;
    // Each round logs at most an aclInit and an aclFinalize, plus a query's three calls: well
    // within the stand-in's log.
    const ROUNDS: usize = 200;
    let install = FakeInstall::standard().unwrap();
    let finalized_inside = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let (install, finalized_inside) = (&install, &finalized_inside);
            scope.spawn(move || {
                let cann = install.cann();
                for _ in 0..ROUNDS {
                    let session = cann.acl_session().unwrap();
                    for _ in 0..3 {
                        if !install.acl_initialized().unwrap() {
                            finalized_inside.fetch_add(1, Ordering::Relaxed);
                        }
                        std::thread::yield_now();
                    }
                    session.end().unwrap();
                    // Half the threads also ask for the SoC name, which holds a session of
                    // its own.
                    if thread % 2 == 1 {
                        assert_eq!(cann.soc_name().unwrap().as_deref(), Some("Ascend910B1"));
                    }
                }
            });
        }
    });
    let finalized_inside = finalized_inside.into_inner();
    assert_eq!(
        finalized_inside, 0,
        "{finalized_inside} checks inside a session found ACL finalized"
    );
    assert!(!install.acl_initialized().unwrap(), "the last session did not finalize ACL");
    let log: Vec<Call> = install.take_log().unwrap();
    let ok = |func: &str| log.iter().filter(|c| c.func == func && c.ret == 0).count();
    assert_eq!(ok("aclInit"), ok("aclFinalize"));
    let repeated = log.iter().filter(|c| c.ret != 0).count();
    assert_eq!(repeated, 0, "calls failed (aclInit found ACL initialised outside the count)");
}
