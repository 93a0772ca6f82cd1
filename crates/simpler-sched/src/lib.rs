//! simpler-sched (being written).
