//! simpler-tensormap (being written).
