//! Counts the requests being served, from their arrival until their
//! answer's body is sent (or dropped), so that shutdown can tell an idle
//! server from a busy one.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::Notify;

/// The requests in flight. Cheap to clone (one shared count).
#[derive(Debug, Clone, Default)]
pub(super) struct InFlight(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    count: AtomicUsize,
    /// Woken when the count drops to zero.
    idle: Notify,
}

impl InFlight {
    /// Counts a request until the returned guard is dropped.
    pub(super) fn start(&self) -> Guard {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        Guard(self.0.clone())
    }

    /// Completes once no request is in flight (at once when none is).
    pub(super) async fn idle(&self) {
        loop {
            let notified = self.0.idle.notified();
            tokio::pin!(notified);
            // Registered before the check, so a drop to zero in between
            // still wakes us.
            notified.as_mut().enable();
            if self.0.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One request in flight.
#[derive(Debug)]
pub(super) struct Guard(Arc<Shared>);

/// `response` with its body holding `guard` (a [`Guard`], or several
/// guards in a tuple), so that the request counts until its last byte is
/// sent.
pub(super) fn hold_until_sent<G: Send + Unpin + 'static>(response: Response, guard: G) -> Response {
    response.map(|body| {
        Body::new(Tracked {
            inner: body,
            _guard: guard,
        })
    })
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A response body that holds its request's guards; the frames pass
/// through untouched (mapped-blob buffers included, for `sendfile`).
struct Tracked<G> {
    inner: Body,
    _guard: G,
}

impl<G: Send + Unpin + 'static> HttpBody for Tracked<G> {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::BodyExt as _;

    use super::*;

    #[tokio::test]
    async fn idle_waits_for_the_last_answer_body() {
        let in_flight = InFlight::default();
        in_flight.idle().await;
        let guard = in_flight.start();
        let response = hold_until_sent(Response::new(Body::from("hello")), guard);
        assert_eq!(response.body().size_hint().exact(), Some(5));
        let waiting = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.idle().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "idle with a body unsent");
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"hello");
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("idle once the body is gone")
            .unwrap();
    }
}
