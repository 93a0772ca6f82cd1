//! Tests of the trb orchestration thread's checks of a submitted task.

use super::*;

#[test]
fn a_task_names_exactly_the_kernels_its_shape_runs() {
    use TaskShape::{Aic, Aiv, Dummy, Mix};
    const N: i32 = NO_FUNC;
    for (shape, funcs, members) in [
        (Aic, [4, N, N], 1),
        (Aiv, [N, 4, N], 1),
        (Mix, [4, N, 4], 2),
        (Mix, [4, 5, 6], 3),
        (Dummy, [N; 3], 1),
    ] {
        assert_eq!(members_per_block(shape, &funcs), Ok(members), "{shape:?} {funcs:?}");
    }
    for (shape, funcs, why) in [
        (Aiv, [0, 4, 0], "an AIV task needs exactly one AIV kernel"),
        (Aiv, [N, 4, 0], "an AIV task needs exactly one AIV kernel"),
        (Aiv, [N, N, 4], "an AIV task needs exactly one AIV kernel"),
        (Aic, [4, 0, N], "an AIC task needs exactly the AIC kernel"),
        (Aic, [N, 4, N], "an AIC task needs exactly the AIC kernel"),
        (Mix, [N; 3], "a MIX task names no kernel"),
        (Dummy, [N, 4, N], "a dummy task names kernels"),
    ] {
        assert_eq!(members_per_block(shape, &funcs), Err(why), "{shape:?} {funcs:?}");
    }
}
