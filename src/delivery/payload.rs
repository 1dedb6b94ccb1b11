//! The bundle bytes of one delivery request: loaded on the first sandbox
//! that asks for them (never on cache hits), then written to every sandbox
//! of the request from one buffer.
//!
//! Memory is bounded twice: bytes that come from the bundle cache are
//! already counted there (the cache entry is held until the last sandbox is
//! served); bytes read from the blob file take permits of the process-wide
//! in-flight budget for as long as they are held. A bundle larger than the
//! whole in-flight budget is streamed from the blob file to each sandbox
//! instead of buffered.

use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};

use crate::cache::ByteStream;
use crate::store::RevisionRecord;
use crate::workload::{BundleSource, WorkloadError};

/// Budget permits are KiB, so a `u32` permit count covers 4 TiB.
const PERMIT_BYTES: u64 = 1024;

/// The process-wide in-flight byte budget of deliveries.
#[derive(Debug, Clone)]
pub(super) struct InflightBudget {
    permits: Arc<Semaphore>,
    total: u32,
}

impl InflightBudget {
    /// A budget of `bytes` (at least one permit).
    pub(super) fn new(bytes: u64) -> Self {
        let total = u32::try_from(bytes.div_ceil(PERMIT_BYTES))
            .unwrap_or(u32::MAX)
            .clamp(1, Semaphore::MAX_PERMITS as u32);
        Self {
            permits: Arc::new(Semaphore::new(total as usize)),
            total,
        }
    }

    /// Permits for `bytes`, or `None` when they exceed the whole budget.
    fn permits_for(&self, bytes: u64) -> Option<u32> {
        u32::try_from(bytes.div_ceil(PERMIT_BYTES))
            .ok()
            .filter(|p| *p <= self.total)
    }
}

/// Why bytes could not be sent.
#[derive(Debug)]
pub(super) enum SendError {
    /// The bundle could not be opened or read: the workload service's
    /// typed cause (object-storage trouble is the client's to know, the
    /// rest is logged and answered generically).
    Source(WorkloadError),
    /// Writing to the sandbox failed (it may have stopped reading: its
    /// `ERROR` line says why).
    Write(io::Error),
}

impl From<WorkloadError> for SendError {
    fn from(e: WorkloadError) -> Self {
        SendError::Source(e)
    }
}

/// The loaded bytes, or the decision to stream them per sandbox.
enum Loaded {
    Chunks {
        chunks: Vec<Bytes>,
        /// The cache's stream, held so the bytes stay counted as resident
        /// until every sandbox of the request is served.
        _cache_entry: Mutex<Option<ByteStream>>,
        /// In-flight budget for bytes read from disk.
        _permit: Option<OwnedSemaphorePermit>,
    },
    Stream,
}

/// One request's bundle.
pub(super) struct Payload {
    source: BundleSource,
    budget: InflightBudget,
    loaded: OnceCell<Arc<Loaded>>,
}

impl Payload {
    /// The bundle of `source`; nothing is read yet.
    pub(super) fn new(source: BundleSource, budget: InflightBudget) -> Self {
        Self {
            source,
            budget,
            loaded: OnceCell::new(),
        }
    }

    fn revision(&self) -> &RevisionRecord {
        self.source.revision()
    }

    /// The bundle's size: what a sandbox must ask for.
    pub(super) fn len(&self) -> u64 {
        self.revision().bytes
    }

    /// Writes the whole bundle to `to`.
    pub(super) async fn write_to(
        &self,
        to: &mut (dyn AsyncWrite + Send + Unpin),
    ) -> Result<(), SendError> {
        let loaded = self
            .loaded
            .get_or_try_init(|| async { self.load().await.map(Arc::new) })
            .await?
            .clone();
        match &*loaded {
            Loaded::Chunks { chunks, .. } => {
                for chunk in chunks {
                    to.write_all(chunk).await.map_err(SendError::Write)?;
                }
            }
            Loaded::Stream => {
                let mut stream = self.open().await?;
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(|e| self.source_error(e))?;
                    to.write_all(&chunk).await.map_err(SendError::Write)?;
                }
            }
        }
        to.flush().await.map_err(SendError::Write)
    }

    async fn open(&self) -> Result<ByteStream, SendError> {
        let bundle = self.source.open().await?;
        bundle
            .stream(0, self.revision().bytes)
            .await
            .map_err(|e| self.source_error(e))
    }

    /// A failure to read the opened bundle, naming it (for the log).
    fn source_error(&self, e: io::Error) -> SendError {
        SendError::Source(WorkloadError::Internal(format!(
            "reading bundle {}: {e}",
            self.revision().bundle_digest
        )))
    }

    async fn load(&self) -> Result<Loaded, SendError> {
        let len = self.revision().bytes;
        let bundle = self.source.open().await?;
        let from_memory = bundle.is_memory();
        let permit = if from_memory {
            None
        } else {
            let Some(permits) = self.budget.permits_for(len) else {
                return Ok(Loaded::Stream);
            };
            let permit = self
                .budget
                .permits
                .clone()
                .acquire_many_owned(permits)
                .await
                .map_err(|e| {
                    SendError::Source(WorkloadError::Internal(format!("in-flight budget: {e}")))
                })?;
            Some(permit)
        };
        let mut stream = bundle
            .stream(0, len)
            .await
            .map_err(|e| self.source_error(e))?;
        let mut chunks = Vec::new();
        while let Some(chunk) = stream.next().await {
            chunks.push(chunk.map_err(|e| self.source_error(e))?);
        }
        // A disk read owns its bytes; only a cache entry must be held.
        let cache_entry = from_memory.then_some(stream);
        Ok(Loaded::Chunks {
            chunks,
            _cache_entry: Mutex::new(cache_entry),
            _permit: permit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_counts_kib_and_refuses_what_never_fits() {
        let b = InflightBudget::new(10 * 1024);
        assert_eq!(b.permits_for(1), Some(1));
        assert_eq!(b.permits_for(10 * 1024), Some(10));
        assert_eq!(b.permits_for(10 * 1024 + 1), None);
        assert_eq!(InflightBudget::new(0).total, 1);
    }
}
