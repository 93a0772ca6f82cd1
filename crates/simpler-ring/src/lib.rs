//! simpler-ring (being written).
