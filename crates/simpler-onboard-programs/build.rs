//! Records the target triple so the host build of the AICore executor (feature `host-build`)
//! is compiled for the host target. Nothing is compiled here.

fn main() {
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=SIMPLER_ONBOARD_PROGRAMS_TARGET={target}");
    println!("cargo:rerun-if-changed=build.rs");
}
