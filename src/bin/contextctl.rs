//! `contextctl`: the command-line client.
fn main() {}
