//! Development tasks for the simpler workspace (`cargo xtask ...`).

fn main() {}
