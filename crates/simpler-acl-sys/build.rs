//! Records the target triple so the test-only stand-in library is compiled for the host target.
//! Nothing is detected, compiled or linked here: CANN is loaded at run time.

fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=SIMPLER_ACL_SYS_TARGET={target}");
    println!("cargo:rerun-if-changed=build.rs");
}
