//! MQTT ingestion: an inbound adapter beside [`crate::http`], subscribing to a broker and
//! writing the points of each message through the series domain.
//!
//! - [`settings`]: the broker URL, topic filter, client id and credentials, checked at start
//! - [`payload`]: a message's points (the JSON body of a series write, or line protocol)
//! - [`subscriber`]: the connection, the writes, and acknowledgements after each commit
//! - [`metrics`]: messages by outcome, points, connection state
//!
//! Trust: a message carries no fanline token. The broker authenticates its clients and its
//! ACLs decide who may publish on which topic; whoever may publish on a series' topic may
//! write that series (see "MQTT ingestion" in docs/operations.md).

mod metrics;
mod payload;
mod settings;
mod subscriber;

pub use metrics::MqttMetrics;
pub use settings::{MqttSettings, TopicFilter};
pub use subscriber::Subscriber;
