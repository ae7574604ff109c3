//! The direct-to-store writer: each chunk is one all-or-nothing [`Series::write`] on the store
//! the configuration names, as the server would do it.

use crate::jobs::Wake;
use anyhow::Context;

use super::Failure;
use super::chunk::Chunk;
use crate::app::open_store;
use crate::config::Config;
use crate::cursor::CursorCodec;
use crate::series::Series;
use crate::store::StoreError;
use crate::timeline::{DomainError, cursor_key};

/// The series domain on the store `config` names. An embedded store that a running server
/// holds is refused with a hint to import through that server instead.
pub(super) async fn open(config: &Config) -> anyhow::Result<Series> {
    let opened =
        open_store(config)
            .await
            .map_err(|err| match err.downcast_ref::<StoreError>() {
                Some(StoreError::InUse(holder)) => anyhow::anyhow!(
                    "{holder}; stop it, or import through it with --server http://HOST:PORT"
                ),
                _ => err,
            })?;
    let key = cursor_key(opened.store.as_ref())
        .await
        .context("failed to read the cursor key from the store")?;
    Ok(Series::new(
        opened.store,
        CursorCodec::new(&key),
        Wake::without_handoff(),
    ))
}

/// Writes `chunk` in one atomic write; returns the points written.
pub(super) async fn write_chunk(series: &Series, chunk: &Chunk) -> Result<usize, Failure> {
    series
        .write(chunk.batch.clone())
        .await
        .map_err(|err| match &err {
            DomainError::Store(store_err) if store_err.is_retryable() => {
                Failure::Retryable(err.into())
            }
            DomainError::Conflict(_) => Failure::Retryable(err.into()),
            _ => Failure::Fatal(err.into()),
        })
}
