//! MQTT ingestion: an inbound adapter beside [`crate::http`], subscribing to a broker and
//! writing the points of each message through the series domain.
//!
//! - [`settings`]: the broker URL, topic filter, client id and credentials, checked at start
//! - [`payload`]: a message's points (the JSON body of a series write, or line protocol)
//! - [`subscriber`]: the connection, the writes, and acknowledgements after each commit
//! - its counters (messages by outcome, points, connection state) are `MqttMetrics` in
//!   [`crate::metrics`]
//!
//! Trust: a message carries no fanline token. The broker authenticates its clients and its
//! ACLs decide who may publish on which topic; whoever may publish on a series' topic may
//! write that series (see "MQTT ingestion" in docs/operations.md).

mod payload;
mod settings;
mod subscriber;

pub use settings::{MqttSettings, TopicFilter};
pub use subscriber::Subscriber;
