//! The storage account: what a connection string names, and Shared Key signatures.
//!
//! The connection string is Azure's standard one (`AZURE_STORAGE_CONNECTION_STRING`):
//! `AccountName=...;AccountKey=...` with either `TableEndpoint=...` or
//! `DefaultEndpointsProtocol=...` and `EndpointSuffix=...`; or
//! `UseDevelopmentStorage=true`, which names Azurite's well-known development account on
//! `127.0.0.1:10002`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Azurite's development account, the same on every machine (documented by Microsoft).
pub const DEVELOPMENT_ACCOUNT: &str = "devstoreaccount1";
pub const DEVELOPMENT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
const DEVELOPMENT_TABLE_ENDPOINT: &str = "http://127.0.0.1:10002/devstoreaccount1";

/// Azurite's development connection string with its table endpoint on `port`.
pub fn development_connection_string(port: u16) -> String {
    format!(
        "DefaultEndpointsProtocol=http;AccountName={DEVELOPMENT_ACCOUNT};\
         AccountKey={DEVELOPMENT_KEY};TableEndpoint=http://127.0.0.1:{port}/{DEVELOPMENT_ACCOUNT};"
    )
}

/// A storage account and where its Table service answers.
#[derive(Clone)]
pub(super) struct Account {
    pub name: String,
    key: Vec<u8>,
    /// The Table service's base URL, without a trailing `/`: `https://{name}.table.{suffix}`,
    /// or a path-style URL such as Azurite's `http://127.0.0.1:10002/devstoreaccount1`.
    pub endpoint: String,
    /// The endpoint's path (empty, or `/devstoreaccount1` path-style), which signatures cover.
    endpoint_path: String,
}

impl std::fmt::Debug for Account {
    /// Never prints the key.
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Account")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Account {
    /// Parses a connection string; the error says which setting is missing or wrong, and
    /// never repeats the key.
    pub fn parse(connection_string: &str) -> Result<Account, String> {
        let mut settings = std::collections::HashMap::new();
        for part in connection_string.split(';').map(str::trim) {
            if part.is_empty() {
                continue;
            }
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| format!("connection string part {:?} has no '='", name_of(part)))?;
            settings.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
        let setting = |name: &str| settings.get(&name.to_ascii_lowercase()).cloned();
        if setting("UseDevelopmentStorage").is_some_and(|value| value.eq_ignore_ascii_case("true"))
        {
            return Account::new(
                DEVELOPMENT_ACCOUNT,
                DEVELOPMENT_KEY,
                DEVELOPMENT_TABLE_ENDPOINT,
            );
        }
        let name = setting("AccountName").ok_or("the connection string has no AccountName")?;
        let key = setting("AccountKey").ok_or(
            "the connection string has no AccountKey (only Shared Key authorization is supported)",
        )?;
        let endpoint = match setting("TableEndpoint") {
            Some(endpoint) => endpoint,
            None => {
                let protocol =
                    setting("DefaultEndpointsProtocol").unwrap_or_else(|| "https".into());
                let suffix = setting("EndpointSuffix").unwrap_or_else(|| "core.windows.net".into());
                format!("{protocol}://{name}.table.{suffix}")
            }
        };
        Account::new(&name, &key, &endpoint)
    }

    fn new(name: &str, key: &str, endpoint: &str) -> Result<Account, String> {
        let key = STANDARD
            .decode(key)
            .map_err(|_| "the connection string's AccountKey is not base64".to_owned())?;
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        let parsed = url::Url::parse(&endpoint)
            .map_err(|err| format!("the table endpoint {endpoint:?} is not a URL: {err}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!(
                "the table endpoint {endpoint:?} is not http or https"
            ));
        }
        Ok(Account {
            name: name.to_owned(),
            key,
            endpoint_path: parsed.path().trim_end_matches('/').to_owned(),
            endpoint,
        })
    }

    /// The `Authorization` header of a request (Shared Key for the Table service): an
    /// HMAC-SHA256 of the verb, content type, date and the resource's path, `path` being the
    /// request's path after the endpoint (`/Tables`, `/events(...)`, `/$batch`), as sent.
    pub fn authorization(&self, verb: &str, content_type: &str, date: &str, path: &str) -> String {
        let resource = format!("/{}{}{path}", self.name, self.endpoint_path);
        let to_sign = format!("{verb}\n\n{content_type}\n{date}\n{resource}");
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(to_sign.as_bytes());
        let signature = STANDARD.encode(mac.finalize().into_bytes());
        format!("SharedKey {}:{signature}", self.name)
    }
}

/// A connection string part's name, for an error (the part may be a key: never its value).
fn name_of(part: &str) -> String {
    part.chars()
        .take(24)
        .filter(|c| c.is_ascii_alphabetic())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_development_shortcut_names_azurite() {
        let account = Account::parse("UseDevelopmentStorage=true").expect("parse");
        assert_eq!(account.name, DEVELOPMENT_ACCOUNT);
        assert_eq!(account.endpoint, DEVELOPMENT_TABLE_ENDPOINT);
        assert_eq!(account.endpoint_path, "/devstoreaccount1");
    }

    #[test]
    fn an_account_without_a_table_endpoint_uses_the_suffix() {
        let account = Account::parse(
            "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=AAAA;EndpointSuffix=core.windows.net",
        )
        .expect("parse");
        assert_eq!(account.endpoint, "https://acme.table.core.windows.net");
        assert_eq!(account.endpoint_path, "");
    }

    #[test]
    fn missing_or_bad_settings_are_named_and_the_key_never_shown() {
        let err = Account::parse("AccountName=acme").expect_err("no key");
        assert!(err.contains("AccountKey"), "{err}");
        let err = Account::parse("AccountName=acme;AccountKey=not base64!").expect_err("bad key");
        assert!(
            err.contains("base64") && !err.contains("not base64!"),
            "{err}"
        );
        let err = Account::parse("AccountName=acme;AccountKey=AAAA;TableEndpoint=ftp://x")
            .expect_err("scheme");
        assert!(err.contains("http"), "{err}");
        let account = Account::parse(&development_connection_string(4000)).expect("parse");
        assert!(!format!("{account:?}").contains(DEVELOPMENT_KEY));
    }

    /// Azurite accepting them is the real check (the conformance suite on Azurite); here:
    /// each part of the request changes the signature.
    #[test]
    fn a_signature_covers_verb_type_date_and_the_account_qualified_path() {
        let account = Account::parse(&development_connection_string(10002)).expect("parse");
        let one = account.authorization("GET", "", "Tue, 01 Dec 2026 16:00:00 GMT", "/Tables");
        assert!(one.starts_with("SharedKey devstoreaccount1:"));
        for other in [
            account.authorization("POST", "", "Tue, 01 Dec 2026 16:00:00 GMT", "/Tables"),
            account.authorization(
                "GET",
                "application/json",
                "Tue, 01 Dec 2026 16:00:00 GMT",
                "/Tables",
            ),
            account.authorization("GET", "", "Tue, 01 Dec 2026 16:00:01 GMT", "/Tables"),
            account.authorization("GET", "", "Tue, 01 Dec 2026 16:00:00 GMT", "/Tables2"),
        ] {
            assert_ne!(one, other);
        }
    }
}
