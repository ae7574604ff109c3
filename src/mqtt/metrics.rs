//! The subscriber's counters, registered with the process's other metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// What became of a message.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// Committed, then acknowledged.
    Written,
    /// Never writable (bad payload, series or value): acknowledged and dropped.
    Invalid,
    /// A write attempt failed (store outage): not acknowledged, retried.
    Failed,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct MqttMetrics {
    messages: Family<OutcomeLabels, Counter>,
    pub points: Counter,
    pub connected: Gauge,
    pub connection_failures: Counter,
}

impl MqttMetrics {
    pub fn count(&self, outcome: Outcome, messages: u64) {
        let outcome = match outcome {
            Outcome::Written => "written",
            Outcome::Invalid => "invalid",
            Outcome::Failed => "failed",
        };
        self.messages
            .get_or_create(&OutcomeLabels { outcome })
            .inc_by(messages);
    }

    pub fn register(&self, registry: &mut Registry) {
        // Every outcome shows from the start, at 0, so a rate over it is defined.
        for outcome in [Outcome::Written, Outcome::Invalid, Outcome::Failed] {
            self.count(outcome, 0);
        }
        registry.register(
            "fanline_mqtt_messages",
            "MQTT messages by outcome: written (committed, then acknowledged), invalid \
             (acknowledged and dropped), failed (write attempts that failed; retried)",
            self.messages.clone(),
        );
        registry.register(
            "fanline_mqtt_points",
            "Points committed from MQTT messages",
            self.points.clone(),
        );
        registry.register(
            "fanline_mqtt_connected",
            "1 while the MQTT subscriber is connected to its broker and subscribed",
            self.connected.clone(),
        );
        registry.register(
            "fanline_mqtt_connection_failures",
            "MQTT connections lost or refused (each followed by a reconnect after a backoff)",
            self.connection_failures.clone(),
        );
    }
}
