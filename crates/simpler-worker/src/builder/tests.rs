//! Tests of the start's bookkeeping that need no worker to start.

#[cfg(feature = "mpi")]
#[test]
fn a_start_unwinding_before_a_remote_child_refuses_that_rank() {
    use std::time::Duration;

    use super::ChildSpec;
    use super::unreached::Unreached;
    use crate::remote::RemoteL3;

    let (spec, refusal) = RemoteL3::detached(1);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _children = Unreached(vec![ChildSpec::Remote(spec)].into_iter().enumerate());
        panic!("an earlier child's start panicked");
    }));
    assert!(unwound.is_err());
    let reason = refusal(Duration::from_secs(5));
    assert_eq!(reason.as_deref(), Some("rank 0's start panicked before reaching this rank"));
}
