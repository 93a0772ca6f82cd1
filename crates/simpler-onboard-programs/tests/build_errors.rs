//! A failed host build says which file or command failed, typed, with the system's error as its
//! source.
#![cfg(feature = "host-build")]

use simpler_onboard_programs::{BuildError, build_host_dispatcher, build_host_orchestrations};

#[test]
fn a_source_directory_that_cannot_be_created_is_a_write_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    match build_host_orchestrations(&file) {
        Err(BuildError::Write { path, source }) => {
            assert_eq!(path, file);
            assert_ne!(source.kind(), std::io::ErrorKind::Other, "{source}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_failed_compilation_keeps_its_status_and_the_compilers_message() {
    let dir = tempfile::tempdir().unwrap();
    // The install directory becomes a string literal in the dispatcher's source; a quote in it
    // ends the literal early, which the compiler refuses.
    let install = dir.path().join("quote\"d");
    match build_host_dispatcher(&dir.path().join("work"), &install) {
        Err(BuildError::Compile { command, status, stderr }) => {
            assert!(!status.success());
            assert!(command.contains("dispatcher.c"), "{command}");
            assert!(!stderr.is_empty());
        }
        other => panic!("{other:?}"),
    }
}
