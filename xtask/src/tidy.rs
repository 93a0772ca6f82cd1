//! `cargo xtask tidy`: repository rules that neither rustfmt nor clippy check.
//!
//! Every finding names the file and line. The rules:
//!
//! 1. **Self-contained references.** No file tracked by git refers to a document the repository
//!    does not contain: a numbered or sectioned spec (`spec 50`, `spec §3.1`, `(spec §…)`), a
//!    `spec/` path, "the spec" or the word "specification", or a path into a shared tree
//!    outside the repository (`../shared`). The project has no specification beside its own
//!    docs: protocols are described in `docs/` and comments point there.
//! 2. **Module docs.** Every source file of a crate (`crates/*/src`, `src/`, `xtask/src`) has a
//!    `//!` line saying what the module is for.
//! 3. **File size.** No non-test source file in those directories is over
//!    [`MAX_LINES`] lines; split it by concept. Test files (`tests.rs`, anything under a
//!    `tests/` directory) are exempt.
//! 4. **Unsafe inventory.** A crate root either forbids unsafe code (`#![forbid(unsafe_code)]`)
//!    or has, in its `//!` docs, a section whose first line contains "Unsafe inventory" and
//!    that names, in backticks, every source file containing `unsafe` by its path in the crate
//!    (`src/backend/sim/memory.rs`; a bare name such as `rt.rs` right after a full path means
//!    the same directory). A listed file without unsafe code is reported too, so the list
//!    stays true. Generated files (under a `generated/` directory) are exempt from rule 2:
//!    `cargo xtask bindgen --check` keeps them true to their generator instead.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Most lines of a non-test source file.
pub(crate) const MAX_LINES: usize = 1000;

/// This file, which spells out the references it looks for; rule 1 skips it.
const THIS_FILE: &str = "xtask/src/tidy.rs";

/// The words that open a crate root's unsafe inventory.
const INVENTORY: &str = "Unsafe inventory";

/// One rule violation.
struct Finding {
    path: String,
    line: usize,
    message: String,
}

/// Runs every rule over the repository at `root`; `Err` lists the findings.
pub(crate) fn run(root: &Path) -> Result<(), String> {
    let files = tracked_files(root)?;
    let mut findings = Vec::new();
    for path in &files {
        let Ok(text) = fs::read_to_string(root.join(path)) else { continue };
        if path != THIS_FILE {
            references(path, &text, &mut findings);
        }
        if is_crate_source(path) && path.ends_with(".rs") {
            if !path.contains("/generated/") {
                module_docs(path, &text, &mut findings);
            }
            if !is_test_file(path) && text.lines().count() > MAX_LINES {
                findings.push(Finding {
                    path: path.clone(),
                    line: MAX_LINES + 1,
                    message: format!(
                        "{} lines; a non-test source file has at most {MAX_LINES}",
                        text.lines().count()
                    ),
                });
            }
        }
    }
    unsafe_inventories(root, &files, &mut findings);
    if findings.is_empty() {
        println!("xtask tidy: {} files clean", files.len());
        return Ok(());
    }
    let mut per_area: BTreeMap<String, usize> = BTreeMap::new();
    for f in &findings {
        println!("{}:{}: {}", f.path, f.line, f.message);
        *per_area.entry(area_of(&f.path)).or_default() += 1;
    }
    let summary: Vec<String> = per_area.iter().map(|(a, n)| format!("{a}: {n}")).collect();
    Err(format!("tidy found {} problem(s) ({})", findings.len(), summary.join(", ")))
}

/// Files tracked by git, relative to `root`, with `/` separators.
fn tracked_files(root: &Path) -> Result<Vec<String>, String> {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("could not run `git ls-files`: {e}"))?;
    if !out.status.success() {
        return Err(format!("`git ls-files` failed ({})", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut files: Vec<String> =
        text.split('\0').filter(|p| !p.is_empty()).map(str::to_owned).collect();
    files.retain(|p| root.join(p).is_file());
    files.sort();
    Ok(files)
}

/// The crate (or top-level area) a path belongs to, for the summary.
fn area_of(path: &str) -> String {
    let mut parts = path.split('/');
    match parts.next() {
        Some("crates") => parts.next().unwrap_or("crates").to_owned(),
        Some(first) if path.contains('/') => first.to_owned(),
        _ => "(root)".to_owned(),
    }
}

/// Whether `path` is a source file of a crate: `crates/*/src/**`, `src/**` or `xtask/src/**`.
fn is_crate_source(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    matches!(parts.as_slice(), ["crates", _, "src", ..] | ["src", ..] | ["xtask", "src", ..])
}

fn is_test_file(path: &str) -> bool {
    path.ends_with("/tests.rs") || path.contains("/tests/")
}

/// Rule 1: references to documents outside the repository.
fn references(path: &str, text: &str, findings: &mut Vec<Finding>) {
    for (i, line) in text.lines().enumerate() {
        if let Some(what) = outside_reference(line) {
            findings.push(Finding {
                path: path.to_owned(),
                line: i + 1,
                message: format!(
                    "refers to `{what}`, which is not in the repository; describe it in docs/"
                ),
            });
        }
    }
}

/// The first reference in `line` to a document outside the repository, if any.
fn outside_reference(line: &str) -> Option<String> {
    if let Some(at) = line.find("../shared") {
        return Some(line[at..].chars().take(24).collect());
    }
    let lower = line.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let word_before =
        |at: usize| at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
    let word_after = |end: usize| {
        end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_')
    };
    for word in ["specification", "the spec", "spec/"] {
        let mut from = 0;
        while let Some(at) = lower[from..].find(word).map(|i| i + from) {
            from = at + word.len();
            // "specification" also counts in its plural; the others must end a word.
            let ends = word == "specification" || word == "spec/" || !word_after(from);
            if !word_before(at) && ends {
                return Some(line[at..].chars().take(24).collect());
            }
        }
    }
    let mut from = 0;
    while let Some(at) = lower[from..].find("spec").map(|i| i + from) {
        from = at + 4;
        let starts_word = !word_before(at);
        let rest = lower[at + 4..].trim_start_matches([' ', '\u{a0}']);
        let numbered = rest.starts_with(|c: char| c.is_ascii_digit()) || rest.starts_with('§');
        if starts_word && numbered {
            return Some(line[at..].chars().take(16).collect());
        }
    }
    None
}

/// Rule 2: a `//!` line.
fn module_docs(path: &str, text: &str, findings: &mut Vec<Finding>) {
    if !text.lines().any(|l| l.trim_start().starts_with("//!")) {
        findings.push(Finding {
            path: path.to_owned(),
            line: 1,
            message: "no `//!` line saying what this module is for".to_owned(),
        });
    }
}

/// Whether a line holds the `unsafe` keyword outside a `//` comment.
fn has_unsafe(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    code.match_indices("unsafe").any(|(at, _)| {
        let b = code.as_bytes();
        let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        (at == 0 || !word(b[at - 1])) && b.get(at + 6).is_none_or(|&c| !word(c))
    })
}

/// Rule 4: every crate root's unsafe inventory.
fn unsafe_inventories(root: &Path, files: &[String], findings: &mut Vec<Finding>) {
    let mut crates: BTreeMap<PathBuf, Vec<&String>> = BTreeMap::new();
    for f in files.iter().filter(|f| is_crate_source(f) && f.ends_with(".rs")) {
        let dir = match f.split('/').collect::<Vec<_>>().as_slice() {
            ["crates", name, ..] => PathBuf::from("crates").join(name),
            ["xtask", ..] => PathBuf::from("xtask"),
            _ => PathBuf::new(),
        };
        crates.entry(dir).or_default().push(f);
    }
    for (dir, sources) in crates {
        let root_file = ["src/lib.rs", "src/main.rs"]
            .iter()
            .map(|r| dir.join(r))
            .find(|p| root.join(p).is_file());
        let Some(root_file) = root_file else { continue };
        let root_path = root_file.to_string_lossy().replace('\\', "/");
        let root_text = fs::read_to_string(root.join(&root_file)).unwrap_or_default();
        if root_text.lines().any(|l| l.trim() == "#![forbid(unsafe_code)]") {
            continue;
        }
        let (listed, at_line) = inventory(&root_text);
        let crate_dir = dir.to_string_lossy().replace('\\', "/");
        let mut unsafe_files = Vec::new();
        for file in sources {
            let text = fs::read_to_string(root.join(file)).unwrap_or_default();
            let Some(line) = text.lines().position(has_unsafe) else { continue };
            let rel = match crate_dir.as_str() {
                "" => file.to_string(),
                d => file.strip_prefix(&format!("{d}/")).unwrap_or(file).to_owned(),
            };
            if !listed.contains(&rel) {
                findings.push(Finding {
                    path: file.to_string(),
                    line: line + 1,
                    message: format!(
                        "contains `unsafe`, but `{rel}` is not in the unsafe inventory of {root_path} (\"{INVENTORY}\" section)"
                    ),
                });
            }
            unsafe_files.push(rel);
        }
        for file in listed.iter().filter(|f| f.starts_with("src/") && !unsafe_files.contains(f)) {
            findings.push(Finding {
                path: root_path.clone(),
                line: at_line,
                message: format!("the unsafe inventory lists `{file}`, which has no `unsafe` code"),
            });
        }
    }
}

/// The files named in backticks in a crate root's inventory section (from the line holding
/// [`INVENTORY`] to the next `#` heading or the end of the docs), and its line (1 when there is
/// none). A bare file name continues the directory of the path before it.
fn inventory(root_text: &str) -> (Vec<String>, usize) {
    let docs: Vec<(usize, &str)> = root_text
        .lines()
        .enumerate()
        .filter_map(|(i, l)| l.trim_start().strip_prefix("//!").map(|d| (i + 1, d.trim())))
        .collect();
    let Some(start) = docs.iter().position(|(_, d)| d.contains(INVENTORY)) else {
        return (Vec::new(), 1);
    };
    let section: Vec<&str> = docs[start..]
        .iter()
        .enumerate()
        .take_while(|(i, (_, d))| *i == 0 || !d.starts_with('#'))
        .map(|(_, (_, d))| *d)
        .collect();
    let text = section.join(" ");
    let mut files = Vec::new();
    let mut dir = String::new();
    for name in text.split('`').skip(1).step_by(2).filter(|n| n.ends_with(".rs")) {
        if let Some((d, _)) = name.rsplit_once('/') {
            dir = d.to_owned();
            files.push(name.to_owned());
        } else if !dir.is_empty() {
            files.push(format!("{dir}/{name}"));
        }
    }
    (files, docs[start].0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_references_are_found_and_ordinary_words_are_not() {
        for line in [
            "// see spec 50 §3.5",
            "//! (spec §3.1)",
            "/// Spec 30 §2 says",
            "[link](../shared/spec/00.md)",
            "spec§4",
            "Workloads of `spec/70-performance.md`",
            "Decisions beyond the spec: the raw setter",
            "The specification describes one thread",
            "as the Specifications say",
            "(the spec)",
        ] {
            assert!(outside_reference(line).is_some(), "{line}");
        }
        for line in [
            "ChildSpec 1",
            "a spec: the design",
            "respec 4",
            "spectral 5",
            "specs",
            "the spectrum",
            "ChildSpec/other",
            "bathe specially",
        ] {
            assert_eq!(outside_reference(line), None, "{line}");
        }
    }

    #[test]
    fn unsafe_is_a_keyword_outside_comments() {
        assert!(has_unsafe("    unsafe { f() }"));
        assert!(has_unsafe("pub unsafe fn f()"));
        assert!(!has_unsafe("#![forbid(unsafe_code)]"));
        assert!(!has_unsafe("    // unsafe here is only a word"));
        assert!(!has_unsafe("#![deny(unsafe_op_in_unsafe_fn)]"));
    }

    #[test]
    fn inventories_name_files_and_bare_names_continue_a_directory() {
        let root = "//! Intro.\n//!\n//! # Unsafe inventory\n//!\n//! - `src/generated/acl.rs`, `rt.rs`: calls.\n//! - `src/loader.rs` (`dlopen`).\n//!\n//! # Next\n//! `src/other.rs`\n";
        let files = vec!["src/generated/acl.rs", "src/generated/rt.rs", "src/loader.rs"];
        assert_eq!(inventory(root), (files.into_iter().map(String::from).collect(), 3));
        assert_eq!(inventory("//! No list.\n"), (Vec::new(), 1));
    }

    #[test]
    fn test_files_and_sources_are_told_apart() {
        assert!(is_crate_source("crates/simpler-ring/src/ring.rs"));
        assert!(is_crate_source("xtask/src/tidy.rs"));
        assert!(is_crate_source("src/lib.rs"));
        assert!(!is_crate_source("crates/simpler-ring/tests/stress.rs"));
        assert!(is_test_file("crates/a/src/runner/tests.rs"));
        assert!(is_test_file("crates/a/src/tests/mod.rs"));
        assert_eq!(area_of("crates/simpler-ring/src/ring.rs"), "simpler-ring");
        assert_eq!(area_of("README.md"), "(root)");
    }
}
