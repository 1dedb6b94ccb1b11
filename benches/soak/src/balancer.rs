//! A round-robin TCP balancer in front of the replicas, as a cloud load
//! balancer or a Kubernetes Service spreads connections: each new
//! connection goes to the next backend, and to the other one when the next
//! refuses (a replica that is down). A connection to a replica that dies
//! breaks, as it would behind any L4 balancer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// Starts the balancer on a free loopback port; returns its address.
pub(crate) async fn start(backends: Vec<SocketAddr>) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let backends = Arc::new(backends);
    let next = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let first = next.fetch_add(1, Ordering::Relaxed);
            let backends = backends.clone();
            tokio::spawn(async move {
                if let Some(server) = connect(&backends, first).await {
                    relay(client, server).await;
                }
                // No backend: dropping the client closes it (a refusal).
            });
        }
    });
    Ok(addr)
}

/// The first backend from `first` on that accepts within a second.
async fn connect(backends: &[SocketAddr], first: usize) -> Option<TcpStream> {
    for i in 0..backends.len() {
        let addr = backends[(first + i) % backends.len()];
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await
        {
            let _ = s.set_nodelay(true);
            return Some(s);
        }
    }
    None
}

async fn relay(mut client: TcpStream, mut server: TcpStream) {
    let _ = client.set_nodelay(true);
    if tokio::io::copy_bidirectional(&mut client, &mut server)
        .await
        .is_err()
    {
        // The backend died mid-request: pass the break on as a reset
        // rather than a clean close, so the client sees what it would
        // behind a real balancer.
        let _ = client.set_zero_linger();
    }
}
