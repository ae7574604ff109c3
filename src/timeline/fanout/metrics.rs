//! Fan-out's own counter (the runner counts jobs; this counts what they wrote), shared by the
//! workers of a process and exported at `/metrics`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// Cheap to clone: clones share the counter.
#[derive(Clone, Debug, Default)]
pub struct FanoutMetrics {
    /// Timeline entries written or deleted by fan-out jobs (the author's own included).
    pub deliveries: Counter,
    /// Events whose post wrote their fan-out itself, with no job (`fanout::in_post`).
    pub in_post: Counter,
}

impl FanoutMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "fanline_fanout_deliveries",
            "Timeline entries written (or removed) by fan-out",
            self.deliveries.clone(),
        );
        registry.register(
            "fanline_fanout_in_post",
            "Events fanned out by their own post, with no job",
            self.in_post.clone(),
        );
    }
}
