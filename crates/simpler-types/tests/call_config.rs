//! `CallConfig` validation: every rule of `CallConfigBuilder::build` (`docs/types.md`) with a passing and a failing case, and the
//! order in which the rules are checked.

use std::path::Path;

use simpler_types::{
    CallConfig, DumpArgsLevel, PmuEvent, RingIndex, RingOverride, RingSel, SwimlaneLevel,
    TypesError,
};

fn ring(i: u8) -> RingIndex {
    RingIndex::new(i).unwrap()
}

#[test]
fn defaults_match_the_spec_and_have_no_diagnostics() {
    let c = CallConfig::default();
    assert_eq!((c.block_dim(), c.aicpu_thread_num()), (0, 0));
    assert_eq!(
        (c.swimlane(), c.dump_args(), c.pmu()),
        (SwimlaneLevel::Off, DumpArgsLevel::Off, None)
    );
    assert!(!c.dep_gen() && !c.scope_stats() && !c.diagnostics_any());
    assert!(c.runtime_env().iter().all(RingOverride::is_unset));
    assert_eq!(c.output_prefix(), None);
    assert_eq!(CallConfig::builder().build(), Ok(c));
}

#[test]
fn known_levels_and_events_are_accepted() {
    for level in 0..=4 {
        let c = CallConfig::builder().swimlane_level(level).output_prefix("out").build().unwrap();
        assert_eq!(c.swimlane().as_u32(), level);
    }
    for level in 0..=3 {
        let c = CallConfig::builder().dump_args_level(level).output_prefix("out").build().unwrap();
        assert_eq!(c.dump_args().as_u32(), level);
    }
    for code in [1, 2, 4, 5, 6, 7, 8] {
        let c = CallConfig::builder().pmu_event(code).output_prefix("out").build().unwrap();
        assert_eq!(c.pmu().map(PmuEvent::as_u32), Some(code));
    }
    assert_eq!(CallConfig::builder().pmu_event(0).build().unwrap().pmu(), None);
}

#[test]
fn unknown_levels_and_events_are_rejected() {
    let b = CallConfig::builder().output_prefix("out");
    assert_eq!(b.clone().swimlane_level(5).build(), Err(TypesError::InvalidSwimlaneLevel(5)));
    assert_eq!(b.clone().dump_args_level(4).build(), Err(TypesError::InvalidDumpArgsLevel(4)));
    for code in [3, 9, u32::MAX] {
        assert_eq!(b.clone().pmu_event(code).build(), Err(TypesError::InvalidPmuEvent(code)));
    }
}

#[test]
fn ring_selector_above_3_is_rejected() {
    assert_eq!(
        CallConfig::builder().heap_bytes(RingSel::Ring(4), 4096).build(),
        Err(TypesError::InvalidRingIndex(4))
    );
    let c = CallConfig::builder().heap_bytes(RingSel::Ring(3), 4096).build().unwrap();
    assert_eq!(c.ring_override(ring(3)).heap_bytes, Some(4096));
    assert_eq!(c.ring_override(ring(2)).heap_bytes, None);
}

#[test]
fn task_window_must_be_a_power_of_two_in_range() {
    for ok in [4, 8, 1 << 20, 1 << 30] {
        let c = CallConfig::builder().task_window(RingSel::All, ok).build().unwrap();
        assert!(c.runtime_env().iter().all(|r| r.task_window == Some(ok as u32)));
    }
    for bad in [0, 2, 6, 1000, 1 << 31, u64::MAX] {
        assert_eq!(
            CallConfig::builder().task_window(RingSel::Ring(2), bad).build(),
            Err(TypesError::TaskWindowOutOfRange { ring: 2, value: bad })
        );
    }
}

#[test]
fn heap_override_must_be_a_non_zero_multiple_of_1024_bytes() {
    assert_eq!(
        CallConfig::builder().heap_bytes(RingSel::Ring(1), 1023).build(),
        Err(TypesError::HeapSizeInvalid { ring: 1, value: 1023 })
    );
    assert_eq!(
        CallConfig::builder().heap_bytes(RingSel::All, 0).build(),
        Err(TypesError::HeapSizeInvalid { ring: 0, value: 0 })
    );
    // The device's rings hand out 1024-byte-aligned blocks: a size between two is refused here,
    // not when the run reaches the chip.
    assert_eq!(
        CallConfig::builder().heap_bytes(RingSel::Ring(2), 1025).build(),
        Err(TypesError::HeapSizeInvalid { ring: 2, value: 1025 })
    );
    let c = CallConfig::builder().heap_bytes(RingSel::Ring(1), 1024).build().unwrap();
    assert_eq!(c.ring_override(ring(1)).heap_bytes, Some(1024));
}

#[test]
fn dep_pool_must_be_in_4_to_i32_max() {
    for bad in [0, 3, i32::MAX as u64 + 1] {
        assert_eq!(
            CallConfig::builder().dep_pool(RingSel::Ring(0), bad).build(),
            Err(TypesError::DepPoolOutOfRange { ring: 0, value: bad })
        );
    }
    for ok in [4, 5, i32::MAX as u64] {
        let c = CallConfig::builder().dep_pool(RingSel::Ring(0), ok).build().unwrap();
        assert_eq!(c.ring_override(ring(0)).dep_pool, Some(ok as u32));
    }
}

#[test]
fn diagnostics_require_an_output_prefix_naming_the_switches() {
    let b = CallConfig::builder()
        .swimlane(SwimlaneLevel::AicpuTiming)
        .pmu(Some(PmuEvent::L2Cache))
        .scope_stats(true);
    assert_eq!(
        b.clone().build(),
        Err(TypesError::OutputPrefixRequired { enabled: vec!["swimlane", "pmu", "scope_stats"] })
    );
    assert_eq!(
        CallConfig::builder().dump_args(DumpArgsLevel::Full).dep_gen(true).build(),
        Err(TypesError::OutputPrefixRequired { enabled: vec!["dump_args", "dep_gen"] })
    );
    let c = b.output_prefix("/tmp/diag").build().unwrap();
    assert!(c.diagnostics_any());
    assert_eq!(c.output_prefix(), Some(Path::new("/tmp/diag")));
}

#[test]
fn output_prefix_must_be_nonempty_utf8_without_nul_and_short() {
    let bad = |p: &str| CallConfig::builder().output_prefix(p).build();
    assert!(matches!(bad(""), Err(TypesError::OutputPrefixInvalid { .. })));
    assert!(matches!(bad("a\0b"), Err(TypesError::OutputPrefixInvalid { .. })));
    assert!(matches!(bad(&"x".repeat(1024)), Err(TypesError::OutputPrefixInvalid { .. })));
    // 1023 bytes is the largest prefix that fits the wire field; a prefix with no diagnostic
    // on is accepted and unused.
    let c = CallConfig::builder().output_prefix("x".repeat(1023)).build().unwrap();
    assert!(!c.diagnostics_any());
    assert_eq!(c.output_prefix().map(|p| p.as_os_str().len()), Some(1023));
}

#[cfg(unix)]
#[test]
fn output_prefix_that_is_not_utf8_is_rejected() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let p = Path::new(OsStr::from_bytes(b"out\xff"));
    let err = CallConfig::builder().output_prefix(p).build().unwrap_err();
    match err {
        TypesError::OutputPrefixInvalid { reason } => assert!(reason.contains("UTF-8"), "{reason}"),
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn rules_are_checked_in_the_documented_order() {
    // Every rule broken at once: the first rule wins, and fixing it exposes the next.
    let mut b = CallConfig::builder()
        .swimlane_level(9)
        .heap_bytes(RingSel::Ring(7), 4096)
        .task_window(RingSel::Ring(1), 3)
        .heap_bytes(RingSel::Ring(0), 5)
        .dep_pool(RingSel::Ring(0), 1)
        .dep_gen(true);
    let mut seen = Vec::new();
    loop {
        let err = b.build().unwrap_err();
        seen.push(err.clone());
        b = match err {
            TypesError::InvalidSwimlaneLevel(_) => b.swimlane_level(0),
            // A bad selector cannot be taken back, so start again without it.
            TypesError::InvalidRingIndex(_) => CallConfig::builder()
                .task_window(RingSel::Ring(1), 3)
                .heap_bytes(RingSel::Ring(0), 5)
                .dep_pool(RingSel::Ring(0), 1)
                .dep_gen(true),
            TypesError::TaskWindowOutOfRange { .. } => b.task_window(RingSel::Ring(1), 4),
            TypesError::HeapSizeInvalid { .. } => b.heap_bytes(RingSel::Ring(0), 1024),
            TypesError::DepPoolOutOfRange { .. } => b.dep_pool(RingSel::Ring(0), 4),
            TypesError::OutputPrefixRequired { .. } => b.output_prefix(""),
            TypesError::OutputPrefixInvalid { .. } => b.output_prefix("out"),
            other => panic!("unexpected error {other:?}"),
        };
        if b.build().is_ok() {
            break;
        }
    }
    assert_eq!(
        seen,
        vec![
            TypesError::InvalidSwimlaneLevel(9),
            TypesError::InvalidRingIndex(7),
            TypesError::TaskWindowOutOfRange { ring: 1, value: 3 },
            TypesError::HeapSizeInvalid { ring: 0, value: 5 },
            TypesError::DepPoolOutOfRange { ring: 0, value: 1 },
            TypesError::OutputPrefixRequired { enabled: vec!["dep_gen"] },
            TypesError::OutputPrefixInvalid { reason: "it is empty".into() },
        ]
    );
}

#[test]
fn ring_override_and_to_builder_round_trip() {
    let o = RingOverride { task_window: Some(64), heap_bytes: Some(1 << 20), dep_pool: Some(16) };
    let c = CallConfig::builder()
        .block_dim(24)
        .aicpu_thread_num(4)
        .ring_override(RingSel::Ring(2), o)
        .output_prefix("d")
        .build()
        .unwrap();
    assert_eq!(c.ring_override(ring(2)), o);
    assert!(c.ring_override(ring(0)).is_unset());
    assert_eq!(c.to_builder().build(), Ok(c.clone()));
    // Cloning shares the prefix instead of copying it.
    let d = c.clone();
    assert!(std::sync::Arc::ptr_eq(
        c.output_prefix_shared().unwrap(),
        d.output_prefix_shared().unwrap()
    ));
}

#[test]
fn is_default_agrees_with_comparing_against_the_default_for_every_setting() {
    // A diagnostic needs an output prefix, so those cases differ in two settings.
    let default = CallConfig::default();
    assert!(default.is_default());
    let b = CallConfig::builder;
    let one_each = [
        b().block_dim(8),
        b().aicpu_thread_num(4),
        b().swimlane(SwimlaneLevel::SchedPhases).output_prefix("/tmp/out"),
        b().dump_args(DumpArgsLevel::Full).output_prefix("/tmp/out"),
        b().pmu(Some(PmuEvent::Memory)).output_prefix("/tmp/out"),
        b().dep_gen(true).output_prefix("/tmp/out"),
        b().scope_stats(true).output_prefix("/tmp/out"),
        b().task_window(RingSel::Ring(3), 1024),
        b().heap_bytes(RingSel::Ring(1), 4096),
        b().dep_pool(RingSel::All, 64),
        b().output_prefix("/tmp/out"),
    ];
    for builder in one_each {
        let c = builder.build().unwrap();
        assert_ne!(c, default);
        assert!(!c.is_default(), "{c:?} reported as the default");
    }
    assert!(b().block_dim(0).build().unwrap().is_default(), "a default value set explicitly");
}
