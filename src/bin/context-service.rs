//! The Context Service server.
fn main() {}
