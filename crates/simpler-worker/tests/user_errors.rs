//! Errors a worker's user meets keep their type and speak the worker's vocabulary: hints name
//! the worker's own settings, task references use one format.

mod common;

use common::host;
use simpler_types::{DataType, TaskArgs};
use simpler_worker::{BuildFailure, Orchestration, WorkerError};

#[derive(Debug, thiserror::Error)]
#[error("the input is not ready")]
struct NotReady;

#[test]
fn an_error_a_graph_callback_returns_keeps_its_type() {
    let w = host().start().expect("start");
    let err = w.run(Orchestration::graph(|_, _, _| Err(NotReady.into()))).expect_err("fails");
    let WorkerError::Build { cause: BuildFailure::Callback(e), .. } = &err else {
        panic!("{err:?}");
    };
    assert!(e.downcast_ref::<NotReady>().is_some(), "{e:?}");
    w.close().expect("close");
}

#[test]
fn a_heap_ring_that_is_too_small_is_reported_with_the_worker_setting() {
    let w = host().sub_workers(1).heap_ring_size(1 << 16).start().expect("start");
    let err = w
        .run(Orchestration::graph(|g, _, _| {
            g.alloc(&[1 << 20], DataType::Float32)?;
            Ok(())
        }))
        .expect_err("never fits");
    let text = err.to_string();
    assert!(text.contains("heap_ring_size"), "{text}");
    w.close().expect("close");
}

#[test]
fn a_failed_task_is_named_in_the_one_task_reference_format() {
    let mut b = host().sub_workers(1);
    let ok = b.register_host("ok", |_| Ok(()));
    let fail = b.register_host("fail", |_| Err("no".into()));
    let w = b.start().expect("start");
    let err = w
        .run(Orchestration::graph(move |g, _, _| {
            g.submit_sub(ok, TaskArgs::new())?;
            g.submit_sub(fail, TaskArgs::new())?;
            Ok(())
        }))
        .expect_err("fails");
    let text = err.to_string();
    assert!(text.contains("run#1/task#1 (host 'fail')"), "{text}");
    w.close().expect("close");
}

#[test]
fn a_clean_close_that_reports_unobserved_failures_says_the_close_itself_succeeded() {
    let mut b = host().sub_workers(1);
    let bad = b.register_host("bad", |_| Err("unseen".into()));
    let w = b.start().expect("start");
    let handle = w
        .submit(Orchestration::graph(move |g, _, _| {
            g.submit_sub(bad, TaskArgs::new())?;
            Ok(())
        }))
        .expect("submit");
    drop(handle);
    let e = w.close().expect_err("one unobserved failure");
    let text = e.to_string();
    assert!(
        text.starts_with("the worker closed cleanly, but 1 run(s) failed that nobody waited for: "),
        "{text}"
    );
    assert!(text.contains("unseen"), "{text}");
}

#[test]
fn debug_output_shows_addresses_in_hex() {
    let w = host().chips(&[0]).start().expect("start");
    let mem = w.chip_memory(simpler_types::WorkerId(0)).expect("memory");
    let buf = mem.malloc(4096).expect("malloc");
    let text = format!("{buf:?}");
    assert!(text.contains(&format!("addr: {:#x}", buf.addr())), "{text}");
    let host = simpler_worker::HostBuffer::new(16).expect("buffer");
    assert!(format!("{host:?}").contains(&format!("addr: {:#x}", host.addr())));
    let ptr = simpler_device_a2a3::DevicePtr(0x12c0000);
    assert_eq!(format!("{ptr:?}"), "DevicePtr(0x12c0000)");
    mem.free(buf).expect("free");
    w.close().expect("close");
}
