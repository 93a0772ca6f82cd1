//! The unsafe inventory in the crate root docs names exactly the source files that contain
//! `unsafe` code (comments aside).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether a line of code (not a comment) uses the `unsafe` keyword.
fn uses_unsafe(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    code.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|w| w == "unsafe")
}

#[test]
fn the_crate_docs_list_every_file_with_unsafe_code_and_no_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let with_unsafe: BTreeSet<String> = files
        .iter()
        .filter(|f| std::fs::read_to_string(f).unwrap().lines().any(uses_unsafe))
        .map(|f| f.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"))
        .collect();
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    let inventory = lib
        .split("Unsafe inventory")
        .nth(1)
        .expect("the crate docs have an unsafe inventory")
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let listed: BTreeSet<String> = inventory
        .split('`')
        .filter(|s| s.starts_with("src/") && s.ends_with(".rs"))
        .map(str::to_owned)
        .collect();
    let missing: Vec<_> = with_unsafe.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&with_unsafe).collect();
    assert!(missing.is_empty(), "files with unsafe code missing from the inventory: {missing:?}");
    assert!(stale.is_empty(), "files in the inventory without unsafe code: {stale:?}");
}
