//! The fixed map must stay usable without `std` or `alloc` (a device runtime builds it for its
//! own target): no source file under `src/fixed/` may name either outside comments and test
//! modules. `cargo build -p simpler-tensormap --no-default-features` checks the same for real;
//! this test keeps the rule visible in every ordinary test run.

use std::fs;
use std::path::Path;

#[test]
fn fixed_uses_only_core() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/fixed");
    let mut checked = 0;
    for file in fs::read_dir(&dir).unwrap() {
        let path = file.unwrap().path();
        let text = fs::read_to_string(&path).unwrap();
        // Unit tests may use std; they start at the test module's `cfg`.
        let tests = text.find("\n#[cfg(test)]").or_else(|| text.find("\n#[cfg(all(test"));
        let code = &text[..tests.unwrap_or(text.len())];
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or("");
            for banned in ["std::", "alloc::", "extern crate", "Vec<", "Box<", "String"] {
                assert!(
                    !line.contains(banned),
                    "{}:{}: `{banned}` in the fixed map: {line}",
                    path.display(),
                    n + 1
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 4, "found only {checked} files under {}", dir.display());
}
