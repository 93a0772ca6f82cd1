//! Device-code names read from another process or rank. A `DeviceCode` names its code with a
//! `'static` string; a name that arrives in a frame is kept once per distinct name, up to
//! [`MAX_CODE_NAMES`], so that a peer of this build, which sends a few dozen at most (the
//! device's symbolic codes), shows the names it sent, and one that sends more, or longer ones,
//! cannot grow the process's memory with them (the code itself always crosses).

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// The most distinct names kept.
const MAX_CODE_NAMES: usize = 256;

/// The longest name kept, in bytes (the device's symbolic names have a few dozen).
const MAX_CODE_NAME_LEN: usize = 128;

/// The name past either bound.
const TOO_MANY: &str = "(a code name a peer sent)";

/// `name`, as a `'static` string (the same one for every call with equal text).
pub(crate) fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    intern_in(&mut names, name)
}

fn intern_in(names: &mut HashSet<&'static str>, name: &str) -> &'static str {
    if let Some(n) = names.get(name) {
        return n;
    }
    if names.len() >= MAX_CODE_NAMES || name.len() > MAX_CODE_NAME_LEN {
        return TOO_MANY;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_from_frames_are_kept_up_to_a_bound() {
        let mut names = HashSet::new();
        let first = intern_in(&mut names, "ACL_ERROR_RT_AICORE_EXCEPTION");
        assert!(std::ptr::eq(first, intern_in(&mut names, "ACL_ERROR_RT_AICORE_EXCEPTION")));
        for i in 0..2 * MAX_CODE_NAMES {
            intern_in(&mut names, &format!("NAME_{i}"));
        }
        assert_eq!(names.len(), MAX_CODE_NAMES);
        assert_eq!(intern_in(&mut names, "UNSEEN"), TOO_MANY);
        assert!(std::ptr::eq(first, intern_in(&mut names, "ACL_ERROR_RT_AICORE_EXCEPTION")));
    }

    #[test]
    fn a_code_name_longer_than_the_bound_is_not_kept() {
        let mut names = HashSet::new();
        let kept = intern_in(&mut names, &"X".repeat(1 << 20));
        assert!(kept == TOO_MANY && names.is_empty(), "a megabyte name was kept for good");
        let longest = "Y".repeat(MAX_CODE_NAME_LEN);
        assert_eq!(intern_in(&mut names, &longest), longest);
    }
}
