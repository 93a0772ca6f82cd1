//! `simpler-worker` (being written).
#![forbid(unsafe_code)]
