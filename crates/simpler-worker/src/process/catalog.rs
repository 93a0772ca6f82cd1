//! What a chip process can run: chip callables travel by content, and native code (function
//! addresses) means nothing in another process, so native content crosses by the name of a
//! program both sides build the same way (`docs/process-mode.md`, "Content").
//!
//! The content bytes of a program are its catalog name and its entry and config names (a
//! renamed program is distinct content) under a fixed prefix; their SHA-256 is the digest the
//! child checks before it prepares anything.

use sha2::{Digest, Sha256};
use simpler_device_a2a3::{ChipCallable, ChipCallableBuilder, programs};

const PREFIX: &[u8] = b"simpler-program\0";

type Build = fn() -> ChipCallableBuilder;

/// The programs every chip process can build, by name.
const PROGRAMS: &[(&str, Build)] = &[
    ("add", programs::add::builder),
    ("vector", programs::vector::builder),
    ("bgemm", programs::bgemm::builder),
];

fn build(program: Build, entry: &str, config: &str) -> Option<ChipCallable> {
    program().names(entry, config).build().ok()
}

/// Content as it crosses into a chip process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Content {
    pub(crate) bytes: Vec<u8>,
    pub(crate) digest: [u8; 32],
    /// The callable's entry name, which errors about the content name it by.
    pub(crate) entry: String,
}

impl Content {
    fn of(program: &str, entry: &str, config: &str) -> Content {
        let mut bytes = PREFIX.to_vec();
        for part in [program, entry, config] {
            bytes.extend_from_slice(part.as_bytes());
            bytes.push(0);
        }
        let digest = Sha256::digest(&bytes).into();
        Content { bytes, digest, entry: entry.to_owned() }
    }
}

/// The content a chip process is sent for `c`, or `None` when `c` cannot cross (native code
/// outside the catalog).
pub(crate) fn content_of(c: &ChipCallable) -> Option<Content> {
    let (entry, config) = (c.entry_name(), c.config_name());
    PROGRAMS
        .iter()
        .find(|(_, program)| build(*program, entry, config).is_some_and(|p| p.id() == c.id()))
        .map(|(name, _)| Content::of(name, entry, config))
}

/// Why content sent to a chip process was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Refused {
    #[error("the content digest does not match its bytes")]
    Digest,
    #[error("the content names no program of this chip process")]
    Unknown,
}

/// The callable `bytes` name, after checking them against `digest`.
pub(crate) fn resolve(bytes: &[u8], digest: &[u8; 32]) -> Result<ChipCallable, Refused> {
    if Sha256::digest(bytes).as_slice() != digest {
        return Err(Refused::Digest);
    }
    let rest = bytes.strip_prefix(PREFIX).ok_or(Refused::Unknown)?;
    let parts: Vec<&str> =
        rest.split(|&b| b == 0).map(|p| std::str::from_utf8(p).unwrap_or("")).collect();
    let [name, entry, config, ""] = parts[..] else { return Err(Refused::Unknown) };
    PROGRAMS
        .iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, program)| build(*program, entry, config))
        .ok_or(Refused::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_programs_cross_and_a_wrong_digest_is_refused() {
        let add = programs::add::builder().names("add_7", "cfg").build().expect("add");
        let content = content_of(&add).expect("add is in the catalog");
        assert_eq!(resolve(&content.bytes, &content.digest).expect("resolves").id(), add.id());
        let mut wrong = content.digest;
        wrong[0] ^= 1;
        assert_eq!(resolve(&content.bytes, &wrong).err(), Some(Refused::Digest));
        let other = Content::of("nothing", "a", "b");
        assert_eq!(resolve(&other.bytes, &other.digest).err(), Some(Refused::Unknown));
    }
}
