//! `simpler-device-a2a3` (being written).
