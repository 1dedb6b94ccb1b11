//! Running async work to its end from a synchronous `main`: the future is
//! spawned on the runtime's worker threads and the calling thread, which
//! never enters the runtime, waits for its output on a channel.

use std::future::Future;

use anyhow::Context as _;
use tokio::runtime::Runtime;

/// Runs `fut` on `runtime`'s workers and waits on this thread for its
/// output; an error when the task panicked (or the runtime dropped it).
/// `runtime` must have worker threads (a current-thread runtime runs
/// tasks only while a thread drives it).
pub fn run_to_end<F>(runtime: &Runtime, fut: F) -> anyhow::Result<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (done, output) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        // The receiver waits until this is sent: it cannot be gone.
        let _ = done.send(fut.await);
    });
    output
        .recv()
        .context("the task stopped before it finished (it panicked)")
}
