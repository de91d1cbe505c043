//! The process's open-files limit, raised at start-up and turned into a connection cap. Each
//! open stream holds two descriptors (the client's socket and the upstream's), so the soft
//! limit most systems start with (1024) would stop the gateway near 500 streams.
//!
//! When descriptors run out, `accept` fails and the server loop backs off (counted in
//! `tf_http_accept_errors_total`); but then so would anything a running stream still opens (an
//! upstream connection, a journal segment, a database connection for its billing). So the cap on
//! client connections is kept below what the limit allows, leaving [`RESERVED_FDS`] for the rest:
//! extra clients wait in the listen backlog instead of failing streams already running.

/// Descriptors kept for everything but client streams: listener, journal, database and Redis
/// pools, idle upstream connections, the runtime's own.
const RESERVED_FDS: u64 = 512;

/// Descriptors one client connection may hold: its socket and its upstream connection.
const FDS_PER_CONNECTION: u64 = 2;

/// Raises the soft open-files limit to the hard one; returns the soft limit now in force (the
/// old one if it could not be raised, which is logged).
pub fn raise_to_hard_limit() -> u64 {
    let before = rlimit::Resource::NOFILE.get().map(|(soft, _)| soft).ok();
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(now) => {
            tracing::info!(
                before = before.unwrap_or(0),
                now,
                streams = now.saturating_sub(RESERVED_FDS) / FDS_PER_CONNECTION,
                "open-files limit raised to the hard limit"
            );
            now
        }
        Err(e) => {
            let now = before.unwrap_or(1024);
            tracing::warn!(error = %e, now, "cannot raise the open-files limit");
            now
        }
    }
}

/// The client-connection cap that `limit` descriptors can carry, at most `configured`.
pub fn connection_cap(configured: usize, limit: u64) -> usize {
    let fits = limit.saturating_sub(RESERVED_FDS) / FDS_PER_CONNECTION;
    usize::try_from(fits).map_or(configured, |fits| configured.min(fits.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_leaves_room_for_the_rest() {
        assert_eq!(connection_cap(16_384, 1024), 256);
        assert_eq!(connection_cap(16_384, 1 << 20), 16_384);
        assert_eq!(connection_cap(16_384, 100), 1);
    }
}
