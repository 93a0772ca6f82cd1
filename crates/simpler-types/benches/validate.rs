//! `Tensor::validate` on the descriptors the engine's submit path sees most: a whole 1-D
//! contiguous tensor, a 1-byte view into a larger buffer, and a strided 3-D window.
//!
//! Every benchmark reports the time of one `validate` call on a descriptor that passes, which is
//! the case submit pays for on every tensor argument of every task.

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use simpler_types::{DataType, Tensor};

/// A whole 1-D FLOAT32 tensor of 4096 elements.
fn contiguous_1d() -> Tensor {
    Tensor::external(0x1_0000_0000, &[4096], DataType::Float32).expect("valid 1-D tensor")
}

/// One byte of a 1000-byte INT8 buffer, as the fan-in workloads write it.
fn one_byte_view() -> Tensor {
    Tensor::external(0x1_0000_0000, &[1000], DataType::Int8)
        .and_then(|t| t.view(&[1], &[517]))
        .expect("valid 1-byte view")
}

/// A `[4, 8, 16]` window at `[1, 2, 3]` of a `[8, 16, 32]` FLOAT16 tensor: strided in every
/// dimension but the last.
fn strided_3d_view() -> Tensor {
    Tensor::external(0x1_0000_0000, &[8, 16, 32], DataType::Float16)
        .and_then(|t| t.view(&[4, 8, 16], &[1, 2, 3]))
        .expect("valid strided 3-D view")
}

fn validate(c: &mut Criterion) {
    let mut group = c.benchmark_group("validate");
    for (name, tensor) in [
        ("contiguous_1d", contiguous_1d()),
        ("one_byte_view", one_byte_view()),
        ("strided_3d_view", strided_3d_view()),
    ] {
        group.bench_function(name, |b| b.iter(|| black_box(&tensor).validate()));
    }
    group.finish();
}

// Written out rather than through `criterion_group!`, whose generated public function would
// carry no documentation.
fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    validate(&mut criterion);
    criterion.final_summary();
}
