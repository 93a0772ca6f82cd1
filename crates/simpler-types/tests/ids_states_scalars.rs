//! Identifiers, state wire values and scalar packing through the public API.

use simpler_types::{
    DataType, RunId, RunState, SlotId, TaskId, TaskState, TypesError, from_scalar, to_scalar,
};

#[test]
fn slot_id_pack_unpack_round_trips() {
    for (index, generation) in [(0, 1), (1, 1), (7, 42), (u32::MAX, 1), (0, u32::MAX)] {
        let s = SlotId::new(index, generation);
        assert_eq!(SlotId::unpack(s.pack()), s);
        assert_eq!(s.pack() >> 32, u64::from(generation));
        assert_eq!(s.pack() as u32, index);
    }
}

#[test]
fn task_state_from_u8_accepts_exactly_0_to_7() {
    let accepted: Vec<u8> = (0..=u8::MAX).filter(|&v| TaskState::from_u8(v).is_some()).collect();
    assert_eq!(accepted, (0..=7).collect::<Vec<_>>());
    assert_eq!(TaskState::from_u8(7), Some(TaskState::Building));
    assert_eq!(TaskState::from_u8(6), Some(TaskState::Consumed));
}

#[test]
fn scalar_packing_follows_the_kernel_rule() {
    assert_eq!(to_scalar(-1i32), 0xFFFF_FFFF);
    assert_eq!(from_scalar::<f32>(to_scalar(1.5f32)), 1.5);
    assert_eq!(to_scalar(u64::MAX), u64::MAX);
    assert_eq!(from_scalar::<i64>(to_scalar(i64::MIN)), i64::MIN);
    assert_eq!(from_scalar::<u16>(to_scalar(-1i16)), u16::MAX);
}

#[test]
fn ids_display_as_users_see_them() {
    let run = RunId::from_raw(7).unwrap();
    assert_eq!(TaskId::new(run, 12).to_string(), "run#7/task#12");
    assert_eq!(RunState::Executing.to_string(), "executing");
    assert!(RunState::Building.can_move_to(RunState::Failed));
    assert!(!RunState::Completed.can_move_to(RunState::Failed));
}

#[test]
fn data_type_codes_and_names_round_trip() {
    for d in DataType::ALL {
        assert_eq!(DataType::try_from(d.as_u8()), Ok(d));
        assert_eq!(d.name().parse::<DataType>(), Ok(d));
        assert!(d.element_size() > 0);
    }
    assert_eq!(DataType::try_from(255), Err(TypesError::UnknownDataType(255)));
}
