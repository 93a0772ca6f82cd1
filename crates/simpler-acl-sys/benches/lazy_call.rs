//! Cost of a call through a lazy wrapper (slot read, then the call) against a call through a
//! function pointer resolved once by hand, both into the same stand-in function
//! (`aclGetRecentErrMsg`, which only takes an uncontended lock).

// The criterion macros generate undocumented public functions.
#![allow(missing_docs)]

use std::ffi::c_char;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use simpler_acl_sys::Library;
use simpler_acl_sys::standin::FakeInstall;

fn bench_calls(c: &mut Criterion) {
    let install = FakeInstall::standard().expect("stand-in install");
    let cann = install.cann();
    let path = install.root().join("usr/local/Ascend/cann/lib64").join(Library::Acl.name());
    // SAFETY: the stand-in's initialisers only set up its own state.
    let raw = unsafe { libloading::Library::new(&path) }.expect("open the stand-in");
    // SAFETY: `aclGetRecentErrMsg` has this signature in the project header and the stand-in.
    let direct: unsafe extern "C" fn() -> *const c_char =
        *unsafe { raw.get(b"aclGetRecentErrMsg") }.expect("symbol");

    let mut group = c.benchmark_group("acl_sys_call");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    group.bench_function("lazy_wrapper", |b| {
        // SAFETY: no arguments; the result is only compared, never dereferenced.
        b.iter(|| black_box(unsafe { cann.aclGetRecentErrMsg() }.is_ok()));
    });
    group.bench_function("direct_pointer", |b| {
        // SAFETY: as above.
        b.iter(|| black_box(unsafe { direct() }.is_null()));
    });
    group.finish();
}

criterion_group!(benches, bench_calls);
criterion_main!(benches);
