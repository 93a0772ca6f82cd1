//! Unit tests of the device errors: the task-reference format, hex addresses, size and wording.
use super::*;
use crate::abi::codes::StallClass;

#[test]
fn task_references_use_the_one_format() {
    let e =
        DeviceError::OverlappingArguments { run_id: RunId::FIRST, task: 3, written: 2, other: 0 };
    assert!(e.to_string().starts_with("run#1/task#3: written tensor 2"), "{e}");
    let fault = CoreFault {
        code: AclCode(507015),
        stream: StreamKind::AiCore,
        core: None,
        func_id: None,
        task: Some(DeviceTaskId::new(0, 7)),
        message: String::new(),
        at_ticks: 0,
    };
    assert!(fault.to_string().ends_with(", task#r0:7"), "{fault}");
}

#[test]
fn a_bad_device_pointer_shows_its_address_in_hex() {
    let e = DeviceError::BadDevicePointer {
        run_id: None,
        arg: None,
        addr: DevicePtr(0x12c0000),
        len: 8,
    };
    assert_eq!(
        format!("{e:?}"),
        "BadDevicePointer { run_id: None, arg: None, addr: DevicePtr(0x12c0000), len: 8 }"
    );
    assert!(e.to_string().contains("8 bytes at 0x12c0000"), "{e}");
}

#[test]
fn device_error_stays_small() {
    // Results of every call carry this type; keep the error path cheap to move.
    assert!(std::mem::size_of::<DeviceError>() <= 96, "{}", std::mem::size_of::<DeviceError>());
}

#[test]
fn scheduler_timeout_display_leads_with_the_mechanism() {
    let mut fault = RuntimeFault::new(RuntimeCode::SchedulerTimeout, "");
    fault.stall = Some(StallInfo {
        class: StallClass::RunningStalled,
        stuck_task: Some(DeviceTaskId::new(1, 42)),
        stuck_core: Some((3, CoreType::Aiv)),
        running: 1,
        ready: 0,
        waiting: 2,
        budget: Duration::from_secs(10),
    });
    let e = DeviceError::Runtime { run_id: RunId::FIRST, fault: Box::new(fault) };
    let text = e.to_string();
    assert!(
        text.starts_with(
            "run#1: scheduler timeout after 10s (S1 running-stalled, task#r1:42 on AIV3"
        ),
        "{text}"
    );
    assert_eq!(e.class(), ErrorClass::Scheduler);
    assert_eq!(e.legacy_status(), 100);
}
