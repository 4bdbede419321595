//! Counters for `/metrics`, and their Prometheus text form. Every metric name is a
//! constant here; label values are bounded (consumer-group names, which admins create).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters the changefeed keeps (monotonic unless named as a gauge).
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) appended: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) filled: AtomicU64,
    pub(crate) partial: AtomicU64,
    pub(crate) compacted: AtomicU64,
    pub(crate) snapshot_rows: AtomicU64,
    pub(crate) snapshot_dropped: AtomicU64,
    pub(crate) snapshot_errors: AtomicU64,
    pub(crate) group_gap_sequences: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) commit_micros: AtomicU64,
    pub(crate) source_skipped: AtomicU64,
    pub(crate) corrupt_records: AtomicU64,
    pub(crate) retention_deleted: AtomicU64,
    pub(crate) retention_runs: AtomicU64,
    pub(crate) retention_errors: AtomicU64,
    pub(crate) poll_requests: AtomicU64,
    pub(crate) poll_events: AtomicU64,
    pub(crate) tx_markers: AtomicU64,
    pub(crate) cursor_polls: AtomicU64,
    pub(crate) cursor_gaps: AtomicU64,
    pub(crate) sse_connections: AtomicU64,
    pub(crate) sse_open: AtomicU64,
    pub(crate) sse_events: AtomicU64,
    pub(crate) sse_heartbeats: AtomicU64,
    pub(crate) ws_connections: AtomicU64,
    pub(crate) ws_open: AtomicU64,
    pub(crate) ws_events: AtomicU64,
    pub(crate) ws_window_full: AtomicU64,
    pub(crate) ws_redelivered: AtomicU64,
    pub(crate) http_bad_requests: AtomicU64,
    pub(crate) auth_failures: AtomicU64,
    pub(crate) group_received: AtomicU64,
    pub(crate) group_redelivered: AtomicU64,
    pub(crate) group_acked: AtomicU64,
    pub(crate) group_nacked: AtomicU64,
    pub(crate) group_dead_lettered: AtomicU64,
    pub(crate) group_lost_to_retention: AtomicU64,
}

pub(crate) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn dec(c: &AtomicU64) {
    c.fetch_sub(1, Ordering::Relaxed);
}

/// Log-level gauges, read when rendering.
pub(crate) struct LogGauges {
    pub(crate) latest_sequence: u64,
    pub(crate) oldest_sequence: u64,
    pub(crate) events: u64,
    pub(crate) size_bytes: u64,
}

/// One consumer group's gauges, read when rendering.
pub(crate) struct GroupGauges {
    pub(crate) name: String,
    pub(crate) committed_offset: u64,
    pub(crate) lag: u64,
    pub(crate) in_flight: u64,
    pub(crate) dead_letters: u64,
}

const P: &str = "freshen_changefeed_";

struct Out(String);

impl Out {
    fn metric(&mut self, name: &str, kind: &str, help: &str, value: u64) {
        let _ = write!(
            self.0,
            "# HELP {P}{name} {help}\n# TYPE {P}{name} {kind}\n{P}{name} {value}\n"
        );
    }

    fn counter(&mut self, name: &str, help: &str, c: &AtomicU64) {
        self.metric(name, "counter", help, c.load(Ordering::Relaxed));
    }

    fn group_family(
        &mut self,
        name: &str,
        help: &str,
        groups: &[GroupGauges],
        f: impl Fn(&GroupGauges) -> u64,
    ) {
        let _ = write!(self.0, "# HELP {P}{name} {help}\n# TYPE {P}{name} gauge\n");
        for g in groups {
            let _ = writeln!(
                self.0,
                "{P}{name}{{group=\"{}\"}} {}",
                escape_label(&g.name),
                f(g)
            );
        }
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition of everything.
pub(crate) fn render(m: &Metrics, log: &LogGauges, groups: &[GroupGauges]) -> String {
    let mut o = Out(String::with_capacity(4096));
    o.metric(
        "latest_sequence",
        "gauge",
        "Last sequence appended (durable).",
        log.latest_sequence,
    );
    o.metric(
        "oldest_sequence",
        "gauge",
        "Oldest sequence still stored.",
        log.oldest_sequence,
    );
    o.metric("events", "gauge", "Events stored.", log.events);
    o.metric(
        "size_bytes",
        "gauge",
        "Bytes of stored events.",
        log.size_bytes,
    );
    o.counter("appended_events_total", "Events appended.", &m.appended);
    o.counter(
        "duplicate_events_total",
        "Replayed events skipped because the log already held their source position.",
        &m.duplicates,
    );
    o.counter(
        "filled_events_total",
        "Events whose unchanged values were filled in from the row's last image.",
        &m.filled,
    );
    o.counter(
        "partial_events_total",
        "Events appended with values still unknown (\"partial\":true): set REPLICA IDENTITY FULL on their tables.",
        &m.partial,
    );
    o.counter(
        "snapshot_rows_total",
        "Rows a snapshot appended as read events.",
        &m.snapshot_rows,
    );
    o.counter(
        "snapshot_dropped_rows_total",
        "Rows a snapshot dropped because they changed while their chunk was in flight (the live event is in the log).",
        &m.snapshot_dropped,
    );
    o.counter(
        "snapshot_errors_total",
        "Snapshot chunks that failed reading the source (retried with backoff).",
        &m.snapshot_errors,
    );
    o.counter(
        "compacted_events_total",
        "Events deleted by compaction (superseded by a later event of their row, or expired tombstones).",
        &m.compacted,
    );
    o.counter("commits_total", "Group commits.", &m.commits);
    o.counter(
        "commit_microseconds_total",
        "Time spent in group commits, in microseconds.",
        &m.commit_micros,
    );
    o.counter(
        "source_skipped_total",
        "Messages the source could not decode (skipped).",
        &m.source_skipped,
    );
    o.counter(
        "corrupt_records_total",
        "Stored records that could not be read (skipped).",
        &m.corrupt_records,
    );
    o.counter(
        "retention_deleted_events_total",
        "Events deleted by retention.",
        &m.retention_deleted,
    );
    o.counter(
        "retention_runs_total",
        "Retention passes.",
        &m.retention_runs,
    );
    o.counter(
        "retention_errors_total",
        "Retention passes that failed.",
        &m.retention_errors,
    );
    o.counter(
        "poll_requests_total",
        "GET /changefeed requests.",
        &m.poll_requests,
    );
    o.counter(
        "poll_events_total",
        "Events returned by GET /changefeed.",
        &m.poll_events,
    );
    o.counter(
        "transaction_markers_total",
        "TRANSACTION_COMMIT markers sent (long poll, Server-Sent Events, WebSocket; tx=1).",
        &m.tx_markers,
    );
    o.counter(
        "cursor_reads_total",
        "Long polls, Server-Sent Events streams and WebSocket subscriptions reading with per-table cursors.",
        &m.cursor_polls,
    );
    o.counter(
        "cursor_gaps_total",
        "Per-table cursors found older than retention (a gap reported for the table).",
        &m.cursor_gaps,
    );
    o.counter(
        "sse_connections_total",
        "Server-Sent Events streams opened.",
        &m.sse_connections,
    );
    o.metric(
        "sse_open",
        "gauge",
        "Server-Sent Events streams open now.",
        m.sse_open.load(Ordering::Relaxed),
    );
    o.counter(
        "sse_events_total",
        "Events sent over Server-Sent Events.",
        &m.sse_events,
    );
    o.counter(
        "sse_heartbeats_total",
        "Heartbeat comments sent over Server-Sent Events.",
        &m.sse_heartbeats,
    );
    o.counter(
        "ws_connections_total",
        "WebSocket connections opened.",
        &m.ws_connections,
    );
    o.metric(
        "ws_open",
        "gauge",
        "WebSocket connections open now.",
        m.ws_open.load(Ordering::Relaxed),
    );
    o.counter(
        "ws_events_total",
        "Events sent over WebSocket.",
        &m.ws_events,
    );
    o.counter(
        "ws_window_full_total",
        "Times a WebSocket subscription paused because its pending-ack window was full.",
        &m.ws_window_full,
    );
    o.counter(
        "ws_redelivered_total",
        "Events sent again over WebSocket after the ack timeout.",
        &m.ws_redelivered,
    );
    o.counter(
        "http_bad_requests_total",
        "Long-poll and stream requests refused as malformed (400).",
        &m.http_bad_requests,
    );
    o.counter(
        "auth_failures_total",
        "Requests refused for a missing, unknown or insufficient token.",
        &m.auth_failures,
    );
    o.counter(
        "group_received_total",
        "Events leased to consumer-group consumers (first deliveries).",
        &m.group_received,
    );
    o.counter(
        "group_redelivered_total",
        "Events leased again after a lease expired or a nack.",
        &m.group_redelivered,
    );
    o.counter(
        "group_acked_total",
        "Consumer-group acknowledgements.",
        &m.group_acked,
    );
    o.counter(
        "group_nacked_total",
        "Consumer-group negative acknowledgements.",
        &m.group_nacked,
    );
    o.counter(
        "group_dead_lettered_total",
        "Events moved to a dead-letter queue.",
        &m.group_dead_lettered,
    );
    o.counter(
        "group_lost_to_retention_total",
        "In-flight consumer-group events deleted by retention before they were acknowledged.",
        &m.group_lost_to_retention,
    );
    o.counter(
        "group_gap_sequences_total",
        "Sequences consumer groups had not received when they were deleted (reported to the group as a gap).",
        &m.group_gap_sequences,
    );
    o.group_family(
        "group_committed_offset",
        "Consumer group: every sequence up to this one is done.",
        groups,
        |g| g.committed_offset,
    );
    o.group_family(
        "group_lag",
        "Consumer group: sequences appended after its committed offset.",
        groups,
        |g| g.lag,
    );
    o.group_family(
        "group_in_flight",
        "Consumer group: events leased or waiting for redelivery.",
        groups,
        |g| g.in_flight,
    );
    o.group_family(
        "group_dead_letters",
        "Consumer group: events in its dead-letter queue.",
        groups,
        |g| g.dead_letters,
    );
    o.0
}
