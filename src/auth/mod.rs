//! Credentials: who a request acts as.
//!
//! - The **admin token** comes from configuration (or, on the embedded store, a file the
//!   server writes on first start) and may do everything, as anyone.
//! - A **subject token** acts as one subject; a **device token** may only add points to one
//!   series (a write-only credential a field device carries, revocable at any time).
//!
//! A token is `fl_{id}_{secret}`. Only the SHA-256 of the secret is stored (the secret is 256
//! random bits, so a plain hash is enough) and it is compared in constant time. Lookups are
//! cached for at most [`CACHE_TTL`], so a revocation reaches every process sharing the
//! store within that time; the cache holds at most `--token-cache-entries` lookups (known
//! and unknown tokens alike), the least used going first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use rand::RngCore as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;
use uuid::Uuid;

use crate::cursor::{CursorCodec, InvalidCursor};
use crate::keys::Ticks;
use crate::notices::{Notice, Notices, Subscription};
use crate::store::{Item, Query, Store, StoreError, StoreExt, StoreResult, Table, Write};

/// How long a token lookup is trusted before the store is asked again.
pub const CACHE_TTL: Duration = Duration::from_millis(500);
/// Most tokens in one listing page, and the default.
pub const MAX_TOKEN_PAGE: usize = 1000;
const TOKEN_ROW: &str = "token";
const PREFIX: &str = "fl_";

/// What a request may act as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Admin,
    /// Acts as this subject.
    Subject(String),
    /// May add points to this series, nothing else.
    Device(String),
}

/// What a stored token grants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
pub enum Grant {
    Subject(String),
    Device(String),
}

impl Grant {
    fn principal(&self) -> Principal {
        match self {
            Grant::Subject(name) => Principal::Subject(name.clone()),
            Grant::Device(name) => Principal::Device(name.clone()),
        }
    }

    fn owner(&self) -> &str {
        match self {
            Grant::Subject(name) | Grant::Device(name) => name,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct StoredToken {
    /// Hex SHA-256 of the secret.
    hash: String,
    grant: Grant,
    created_at: u64,
}

/// A token as listed: never its secret.
#[derive(Clone, Debug)]
pub struct TokenInfo {
    pub token_id: String,
    pub grant: Grant,
    pub created_at: String,
}

/// A page of tokens.
#[derive(Clone, Debug)]
pub struct TokenList {
    pub items: Vec<TokenInfo>,
    pub next_cursor: Option<String>,
}

/// Why a token listing failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenListError {
    #[error("limit must be 1 to {MAX_TOKEN_PAGE}")]
    InvalidLimit,
    #[error(transparent)]
    InvalidCursor(#[from] InvalidCursor),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A freshly issued token: the secret is shown this once.
#[derive(Clone, Debug)]
pub struct Issued {
    pub token_id: String,
    pub token: String,
}

fn owner_partition(owner: &str) -> String {
    format!("owner/{owner}")
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Equal hashes, in time that does not depend on where they differ (`subtle`, so the
/// compiler cannot turn the comparison back into an early exit).
fn same_hash(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.ct_eq(b).into()
}

/// Splits `fl_{32 hex id}_{secret}`.
fn parse(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    (id.len() == 32 && id.bytes().all(|byte| byte.is_ascii_hexdigit()) && !secret.is_empty())
        .then_some((id, secret))
}

/// A new random secret, URL-safe.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A token as the cache holds it: its hash and grant, or known absent.
type Cached = (Option<([u8; 32], Grant)>, Instant);

/// The token service: one per process.
pub struct Tokens {
    store: Arc<dyn Store>,
    cursors: CursorCodec,
    admin_hash: [u8; 32],
    cache: quick_cache::sync::Cache<String, Cached>,
    /// Tells the live streams held with a token, in every process, that it was revoked.
    notices: Notices,
}

/// The topic on which a token's revocation is told.
fn revocation_topic(token_id: &str) -> String {
    format!("token/{token_id}")
}

impl Tokens {
    /// The token service on `store`, caching at most `cache_entries` lookups.
    pub fn new(
        store: Arc<dyn Store>,
        cursors: CursorCodec,
        admin_token: &str,
        cache_entries: usize,
    ) -> Tokens {
        Tokens {
            store,
            cursors,
            admin_hash: sha256(admin_token.as_bytes()),
            cache: quick_cache::sync::Cache::new(cache_entries.max(1)),
            notices: Notices::local(),
        }
    }

    /// Tells `notices` of every revocation, so the streams held with a token end at once.
    pub fn with_notices(mut self, notices: Notices) -> Self {
        self.notices = notices;
        self
    }

    /// A subscription that is told when `token` is revoked; `None` for a token that cannot
    /// be (the admin's) or is not one.
    pub fn watch_revocation(&self, token: &str) -> Option<Subscription> {
        let (id, _) = parse(token)?;
        let mut subscription = self.notices.subscribe(1);
        subscription.watch(&revocation_topic(id));
        Some(subscription)
    }

    /// Token lookups held in the cache.
    #[cfg(test)]
    pub fn cached_lookups(&self) -> usize {
        self.cache.len()
    }

    /// Who `token` acts as; `None` for an unknown, malformed or revoked token.
    pub async fn authenticate(&self, token: &str) -> StoreResult<Option<Principal>> {
        if same_hash(&sha256(token.as_bytes()), &self.admin_hash) {
            return Ok(Some(Principal::Admin));
        }
        let Some((id, secret)) = parse(token) else {
            return Ok(None);
        };
        let known = match self.cache.get(id) {
            Some((known, fetched)) if fetched.elapsed() < CACHE_TTL => known,
            _ => {
                let body = self.store.get(Table::Tokens, id, TOKEN_ROW).await?;
                let known = body
                    .and_then(|body| serde_json::from_slice::<StoredToken>(&body).ok())
                    .and_then(|stored| {
                        let hash = decode_hex(&stored.hash)?;
                        Some((hash, stored.grant))
                    });
                self.cache
                    .insert(id.to_owned(), (known.clone(), Instant::now()));
                known
            }
        };
        Ok(known.and_then(|(hash, grant)| {
            same_hash(&sha256(secret.as_bytes()), &hash).then(|| grant.principal())
        }))
    }

    /// Issues a token for `grant`; its secret is in the answer and nowhere else.
    pub async fn issue(&self, grant: Grant) -> StoreResult<Issued> {
        let id = Uuid::now_v7().simple().to_string();
        let secret = new_secret();
        let stored = StoredToken {
            hash: hex(&sha256(secret.as_bytes())),
            grant: grant.clone(),
            created_at: Ticks::now().get(),
        };
        let body = Bytes::from(serde_json::to_vec(&stored).unwrap_or_default());
        let token_row =
            Write::put_if_absent(Table::Tokens, Item::new(&id, TOKEN_ROW, body.clone()));
        let listed = Write::put(
            Table::Tokens,
            Item::new(owner_partition(grant.owner()), &id, body),
        );
        // Where the store cannot commit both (Azure), the token goes first: if its listing
        // fails, the issue fails, and the token left is inert, as nobody got its secret.
        self.store
            .transact_or_in_order(vec![token_row, listed])
            .await?;
        Ok(Issued {
            token: format!("{PREFIX}{id}_{secret}"),
            token_id: id,
        })
    }

    /// Revokes a token; `false` if there is no such token.
    pub async fn revoke(&self, token_id: &str) -> StoreResult<bool> {
        let Some(body) = self.store.get(Table::Tokens, token_id, TOKEN_ROW).await? else {
            return Ok(false);
        };
        let mut writes = Vec::with_capacity(2);
        if let Ok(stored) = serde_json::from_slice::<StoredToken>(&body) {
            writes.push(Write::delete(
                Table::Tokens,
                owner_partition(stored.grant.owner()),
                token_id,
            ));
        }
        // Where the store cannot commit both (Azure), the listing goes first, then the token,
        // which is what authentication reads: if that delete fails, the revoke fails and the
        // token still works, still found by id, and revoking it again completes.
        writes.push(Write::delete(Table::Tokens, token_id, TOKEN_ROW));
        self.store.transact_or_in_order(writes).await?;
        self.cache.remove(token_id);
        self.notices
            .publish(&revocation_topic(token_id), Notice::Message(Bytes::new()));
        Ok(true)
    }

    /// A page of the tokens issued for `owner` (a subject or a series), without their
    /// secrets, in token-id order (which is issue order): at most `limit`, after the token
    /// `cursor` names.
    pub async fn list(
        &self,
        owner: &str,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<TokenList, TokenListError> {
        if !(1..=MAX_TOKEN_PAGE).contains(&limit) {
            return Err(TokenListError::InvalidLimit);
        }
        let partition = owner_partition(owner);
        let scope = format!("tokens/{partition}");
        let after = cursor
            .map(|cursor| self.cursors.decode(&scope, cursor))
            .transpose()?;
        let mut rows = self
            .store
            .query(Query::partition(Table::Tokens, &partition, limit + 1).after(after))
            .await?;
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next_cursor = rows
            .last()
            .filter(|_| more)
            .map(|last| self.cursors.encode(&scope, &last.row));
        let items = rows
            .into_iter()
            .filter_map(|row| {
                let stored: StoredToken = serde_json::from_slice(&row.value).ok()?;
                Some(TokenInfo {
                    token_id: row.row,
                    grant: stored.grant,
                    created_at: Ticks::clamped(stored.created_at).to_string(),
                })
            })
            .collect();
        Ok(TokenList { items, next_cursor })
    }
}

fn decode_hex(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (index, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(index * 2..index * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_token_cache_holds_at_most_its_capacity() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = crate::store::EmbeddedStore::open_async(dir.path())
            .await
            .expect("open");
        let tokens = Tokens::new(Arc::new(store), CursorCodec::new(b"key"), "admin", 100);
        let issued = tokens
            .issue(Grant::Subject("alice".into()))
            .await
            .expect("issue");
        // Unknown tokens are cached too (as unknown): a flood of made-up ids stays bounded.
        for index in 0..1_000 {
            let made_up = format!("fl_{index:032x}_secret");
            assert_eq!(tokens.authenticate(&made_up).await.expect("lookup"), None);
        }
        let cached = tokens.cached_lookups();
        assert!((1..=100).contains(&cached), "{cached} lookups cached");
        assert_eq!(
            tokens.authenticate(&issued.token).await.expect("lookup"),
            Some(Principal::Subject("alice".into()))
        );
    }

    /// On a store that commits one partition at once, issuing and revoking are ordered
    /// writes: a failure between them leaves no listed token that does not work, and a
    /// revoke that failed half-way completes when it is tried again.
    #[tokio::test]
    async fn on_a_one_partition_store_tokens_are_issued_and_revoked_by_ordered_writes() {
        use crate::store::fault::{Calls, Fault, FaultyStore, Op};
        let dir = tempfile::tempdir().expect("temp dir");
        let store = crate::store::EmbeddedStore::open_async(dir.path())
            .await
            .expect("open");
        let shaped = Arc::new(FaultyStore::new(Arc::new(store)).azure_shaped());
        let tokens = Tokens::new(shaped.clone(), CursorCodec::new(b"key"), "admin", 100);
        let alice = || Grant::Subject("alice".into());
        async fn listed(tokens: &Tokens) -> usize {
            let page = tokens.list("alice", 10, None).await.expect("list");
            page.items.len()
        }

        let issued = tokens.issue(alice()).await.expect("issue");
        assert_eq!(
            tokens.authenticate(&issued.token).await.expect("auth"),
            Some(Principal::Subject("alice".into()))
        );
        assert_eq!(listed(&tokens).await, 1);

        // The listing fails after the token row: the issue fails, nothing is listed.
        shaped.fail_nth(2, Calls::on(Op::Put, Table::Tokens), Fault::Permanent);
        assert!(tokens.issue(alice()).await.is_err());
        assert_eq!(listed(&tokens).await, 1);

        // The token's delete fails after its listing's: the token still works; a second
        // revoke completes.
        shaped.fail_nth(2, Calls::on(Op::Delete, Table::Tokens), Fault::Permanent);
        assert!(tokens.revoke(&issued.token_id).await.is_err());
        tokens.cache.remove(&issued.token_id);
        assert!(
            tokens
                .authenticate(&issued.token)
                .await
                .expect("auth")
                .is_some()
        );
        assert!(tokens.revoke(&issued.token_id).await.expect("revoke again"));
        assert_eq!(
            tokens.authenticate(&issued.token).await.expect("auth"),
            None
        );
        assert_eq!(listed(&tokens).await, 0);
    }

    #[test]
    fn tokens_parse_only_in_their_one_shape() {
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(parse(&format!("fl_{id}_secret")), Some((id, "secret")));
        assert_eq!(parse(&format!("fl_{id}_")), None);
        assert_eq!(parse("fl_short_secret"), None);
        assert_eq!(parse(&format!("xx_{id}_secret")), None);
        assert_eq!(decode_hex(&hex(&[7u8; 32])), Some([7u8; 32]));
        let hash = sha256(b"same");
        assert!(same_hash(&hash, &sha256(b"same")));
        assert!(!same_hash(&hash, &sha256(b"sane")));
    }
}
