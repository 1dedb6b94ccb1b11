//! Streaming inspection of gzip-compressed tar bundles, the canonical
//! archive, and revision digests. Knows nothing about HTTP.
