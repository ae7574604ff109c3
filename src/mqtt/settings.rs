//! What the subscriber is told: the broker (from `--mqtt-url`), the topic filter, the client
//! id and the credentials, checked once at start so that a bad setting stops the process
//! with the flag's name instead of failing on every reconnect.

use std::time::Duration;

use anyhow::Context;
use percent_encoding::percent_decode_str;
use sha2::{Digest, Sha256};

use crate::config::{Config, StoreKind};

/// The port of `mqtt://` when the URL names none.
const DEFAULT_PORT: u16 = 1883;
/// How often the client pings an idle broker; the broker drops it after 1.5 times this.
const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// A checked MQTT configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MqttSettings {
    pub host: String,
    pub port: u16,
    pub filter: TopicFilter,
    pub client_id: String,
    pub credentials: Option<(String, String)>,
    pub keep_alive: Duration,
}

impl MqttSettings {
    /// The settings of `config`, or `None` when no broker is configured. `role` (`serve`,
    /// `worker`) goes into the default client id, so two processes of one host differ.
    pub fn from_config(config: &Config, role: &str) -> anyhow::Result<Option<MqttSettings>> {
        let Some(text) = config.mqtt_url.as_deref() else {
            return Ok(None);
        };
        let broker = Broker::parse(text).context("FANLINE_MQTT_URL (or --mqtt-url)")?;
        let filter = TopicFilter::parse(&config.mqtt_topic)
            .map_err(anyhow::Error::msg)
            .context("FANLINE_MQTT_TOPIC (or --mqtt-topic)")?;
        let client_id = match &config.mqtt_client_id {
            Some(id) => {
                anyhow::ensure!(
                    !id.is_empty() && id.len() <= 65_535,
                    "FANLINE_MQTT_CLIENT_ID (or --mqtt-client-id) must not be empty"
                );
                id.clone()
            }
            None => default_client_id(config, role),
        };
        let username_opt = config.mqtt_username.clone().or(broker.username);
        let password_opt = config.mqtt_password.clone().or(broker.password);
        let credentials = match (username_opt, password_opt) {
            (Some(username), password) => Some((username, password.unwrap_or_default())),
            (None, Some(_)) => anyhow::bail!(
                "an MQTT password is set without a user name (set FANLINE_MQTT_USERNAME)"
            ),
            (None, None) => None,
        };
        Ok(Some(MqttSettings {
            host: broker.host,
            port: broker.port,
            filter,
            client_id,
            credentials,
            keep_alive: KEEP_ALIVE,
        }))
    }
}

/// The parts of an `mqtt://` URL.
#[derive(Debug, PartialEq, Eq)]
struct Broker {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
}

impl Broker {
    fn parse(text: &str) -> anyhow::Result<Broker> {
        let url = url::Url::parse(text).with_context(|| format!("not a URL: {text:?}"))?;
        match url.scheme() {
            "mqtt" | "tcp" => {}
            "mqtts" | "ssl" | "ws" | "wss" => anyhow::bail!(
                "{}:// is not supported: fanline speaks plain MQTT over TCP (put a TLS \
                 terminator such as the broker's own bridge in front)",
                url.scheme()
            ),
            other => anyhow::bail!("the scheme must be mqtt://, not {other}://"),
        }
        let host = url
            .host_str()
            .filter(|host| !host.is_empty())
            .context("the URL names no host")?
            // An IPv6 literal comes bracketed; the socket address wants it bare.
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        anyhow::ensure!(
            url.path().is_empty() || url.path() == "/",
            "the URL must not have a path (the topic is FANLINE_MQTT_TOPIC)"
        );
        let decode = |part: &str| -> anyhow::Result<String> {
            Ok(percent_decode_str(part)
                .decode_utf8()
                .context("the URL's credentials are not UTF-8")?
                .into_owned())
        };
        let username = match url.username() {
            "" => None,
            name => Some(decode(name)?),
        };
        let password = url.password().map(decode).transpose()?;
        Ok(Broker {
            host,
            port: url.port().unwrap_or(DEFAULT_PORT),
            username,
            password,
        })
    }
}

/// A topic filter with one `+` level: the level that names the series.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicFilter {
    /// As subscribed to, `$share/<group>/` prefix included.
    pub subscription: String,
    /// The filter's levels, without the share prefix: what a topic is matched against.
    levels: Vec<String>,
    /// Which level is the series name.
    series_level: usize,
}

impl TopicFilter {
    pub fn parse(text: &str) -> Result<TopicFilter, String> {
        let filter = match text.strip_prefix("$share/") {
            Some(rest) => match rest.split_once('/') {
                Some((group, filter)) if !group.is_empty() && !group.contains(['+', '#']) => filter,
                _ => {
                    return Err(format!(
                        "{text:?}: a shared subscription is $share/<group>/<filter>"
                    ));
                }
            },
            None => text,
        };
        let levels: Vec<String> = filter.split('/').map(str::to_owned).collect();
        for (index, level) in levels.iter().enumerate() {
            let wildcard = level.contains(['+', '#']);
            let whole = level == "+" || (level == "#" && index == levels.len() - 1);
            if wildcard && !whole {
                return Err(format!(
                    "{text:?}: `+` must be a whole level and `#` the whole last level"
                ));
            }
        }
        let pluses: Vec<usize> = (0..levels.len()).filter(|&i| levels[i] == "+").collect();
        let [series_level] = pluses[..] else {
            return Err(format!(
                "{text:?}: the filter needs exactly one `+` level, the series name \
                 (such as fanline/series/+/points)"
            ));
        };
        Ok(TopicFilter {
            subscription: text.to_owned(),
            levels,
            series_level,
        })
    }

    /// The series level of `topic`, if the topic matches the filter.
    pub fn series_of<'t>(&self, topic: &'t str) -> Option<&'t str> {
        let mut series_opt = None;
        let mut topic_levels = topic.split('/');
        for (index, level) in self.levels.iter().enumerate() {
            if level == "#" {
                return series_opt;
            }
            let got = topic_levels.next()?;
            if index == self.series_level {
                series_opt = Some(got);
            } else if level != got {
                return None;
            }
        }
        match topic_levels.next() {
            Some(_) => None,
            None => series_opt,
        }
    }
}

/// `fanline` and 16 hex digits of a hash of the host, the store and the process's address:
/// the same on every start of one deployment (the broker's session, with the messages not
/// yet acknowledged, waits for that id), different between processes sharing a broker. 23
/// characters, letters and digits only: what MQTT 3.1.1 brokers must accept.
fn default_client_id(config: &Config, role: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default();
    let store = match config.store {
        StoreKind::Embedded => {
            let dir =
                std::fs::canonicalize(&config.data_dir).unwrap_or_else(|_| config.data_dir.clone());
            format!("embedded:{}", dir.display())
        }
        StoreKind::Dynamodb => format!(
            "dynamodb:{}:{}",
            config.dynamodb_endpoint.as_deref().unwrap_or_default(),
            config.table_prefix()
        ),
        StoreKind::Azure => format!("azure:{}", config.table_prefix()),
    };
    let address = match role {
        "worker" => config
            .metrics_listen
            .map(|address| address.to_string())
            .unwrap_or_default(),
        _ => config.listen.to_string(),
    };
    let digest = Sha256::digest(format!("{}\n{store}\n{role}\n{address}", host.trim()));
    let hex: String = digest[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("fanline{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(url: &str) -> Config {
        let mut config = Config::defaults();
        config.mqtt_url = Some(url.to_owned());
        config
    }

    #[test]
    fn a_url_gives_host_port_and_decoded_credentials() {
        let settings = MqttSettings::from_config(
            &config_with("mqtt://dev%40site:p%3Ass@broker.example:1884"),
            "serve",
        )
        .expect("ok")
        .expect("configured");
        assert_eq!(settings.host, "broker.example");
        assert_eq!(settings.port, 1884);
        assert_eq!(
            settings.credentials,
            Some(("dev@site".to_owned(), "p:ss".to_owned()))
        );
        let plain = MqttSettings::from_config(&config_with("mqtt://[::1]"), "serve")
            .expect("ok")
            .expect("configured");
        assert_eq!((plain.host.as_str(), plain.port), ("::1", 1883));
        assert_eq!(plain.credentials, None);
    }

    #[test]
    fn flags_override_the_credentials_of_the_url() {
        let mut config = config_with("mqtt://url-user:url-pass@localhost");
        config.mqtt_username = Some("flag-user".into());
        let settings = MqttSettings::from_config(&config, "serve")
            .expect("ok")
            .expect("configured");
        assert_eq!(
            settings.credentials,
            Some(("flag-user".to_owned(), "url-pass".to_owned()))
        );
    }

    #[test]
    fn bad_urls_and_filters_name_their_setting() {
        for url in [
            "mqtts://host",
            "http://host",
            "mqtt://host/topic",
            "not a url",
        ] {
            let err = MqttSettings::from_config(&config_with(url), "serve").expect_err(url);
            assert!(format!("{err:#}").contains("FANLINE_MQTT_URL"), "{err:#}");
        }
        for topic in [
            "fanline/series/points",
            "a/+/+/b",
            "a/b+/c",
            "a/#/b",
            "$share//a/+",
        ] {
            let mut config = config_with("mqtt://localhost");
            config.mqtt_topic = topic.to_owned();
            let err = MqttSettings::from_config(&config, "serve").expect_err(topic);
            assert!(format!("{err:#}").contains("FANLINE_MQTT_TOPIC"), "{err:#}");
        }
        assert!(
            MqttSettings::from_config(&Config::defaults(), "serve")
                .expect("ok")
                .is_none()
        );
    }

    #[test]
    fn the_series_is_the_plus_level_of_a_matching_topic() {
        let filter = TopicFilter::parse("fanline/series/+/points").expect("filter");
        assert_eq!(
            filter.series_of("fanline/series/room-1/points"),
            Some("room-1")
        );
        assert_eq!(filter.series_of("fanline/series//points"), Some(""));
        assert_eq!(filter.series_of("fanline/series/room-1/other"), None);
        assert_eq!(filter.series_of("fanline/series/room-1/points/x"), None);
        assert_eq!(filter.series_of("fanline/series/room-1"), None);

        let shared = TopicFilter::parse("$share/ingest/site/+/#").expect("filter");
        assert_eq!(shared.subscription, "$share/ingest/site/+/#");
        assert_eq!(shared.series_of("site/pump.7/a/b"), Some("pump.7"));
        assert_eq!(shared.series_of("site/pump.7"), Some("pump.7"));
        assert_eq!(shared.series_of("other/pump.7"), None);
    }

    #[test]
    fn the_default_client_id_is_stable_short_and_differs_by_role_and_store() {
        let config = config_with("mqtt://localhost");
        let id = default_client_id(&config, "serve");
        assert_eq!(id, default_client_id(&config, "serve"));
        assert_eq!(id.len(), 23);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
        assert_ne!(id, default_client_id(&config, "worker"));
        let mut other = config.clone();
        other.data_dir = "/elsewhere".into();
        assert_ne!(id, default_client_id(&other, "serve"));
    }
}
