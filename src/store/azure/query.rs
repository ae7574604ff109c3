//! Reading one partition by row-key range.
//!
//! A query reads forwards only, at most 1,000 entities a request, and may answer a short or
//! empty page with a continuation: pages are followed until the limit is reached or no
//! continuation is left. Bounds are written keys, which keep the order of keys, so a range
//! of written keys holds exactly the keys of the range.
//!
//! A reverse read is served by a forward read of the whole range, keeping its last `limit`
//! rows: a request per 1,000 rows of the range, however few are asked for. The callers that
//! read in reverse read small ranges (a timeline's oldest entry, a journal's markers).

use std::collections::VecDeque;
use std::sync::Arc;

use reqwest::{Method, StatusCode};

use super::AzureStore;
use super::entity::{parse_entities, written_key, written_row};
use super::http::{Operation, Request};
use super::layout::{placement, tag_end};
use crate::store::{Direction, Item, Query, StoreResult};

/// Azure's most entities in one query answer.
const PAGE: usize = 1000;

/// A string literal of an OData filter.
pub(super) fn literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

impl AzureStore {
    pub(super) async fn query_partition(&self, query: &Query) -> StoreResult<Vec<Item>> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let filter = filter_of(query)?;
        let partition: Arc<str> = Arc::from(query.partition.as_str());
        let path = format!("/{}()", self.table_name(query.table));
        // Forward: the first `limit` rows. Reverse: the last `limit`, in reverse.
        let mut kept: VecDeque<Item> = VecDeque::new();
        let mut continuation: Option<(String, String)> = None;
        loop {
            let top = match query.direction {
                Direction::Forward => (query.limit - kept.len()).min(PAGE),
                Direction::Reverse => PAGE,
            };
            let (body, next) = self
                .query_page(&path, &filter, Some(top), continuation.as_ref())
                .await?;
            for entity in parse_entities(&body, query.table)? {
                kept.push_back(Item {
                    partition: partition.clone(),
                    row: entity.row,
                    value: entity.value,
                });
                if query.direction == Direction::Reverse && kept.len() > query.limit {
                    kept.pop_front();
                }
            }
            continuation = next;
            let full = query.direction == Direction::Forward && kept.len() >= query.limit;
            if full || continuation.is_none() {
                break;
            }
        }
        let mut items: Vec<Item> = kept.into();
        if query.direction == Direction::Reverse {
            items.reverse();
        }
        Ok(items)
    }

    /// One page of a query of the Azure table at `path` (`/{table}()`): its body and the
    /// continuation it gives. At most `top` entities if given; a page may be short or empty
    /// and still have a continuation.
    pub(super) async fn query_page(
        &self,
        path: &str,
        filter: &str,
        top: Option<usize>,
        continuation: Option<&(String, String)>,
    ) -> StoreResult<(bytes::Bytes, Option<(String, String)>)> {
        let mut request = Request::new(Operation::QueryEntities, Method::GET, path.to_owned());
        request.query.push(("$filter", filter.to_owned()));
        if let Some(top) = top {
            request.query.push(("$top", top.to_string()));
        }
        if let Some((next_partition, next_row)) = continuation {
            request
                .query
                .push(("NextPartitionKey", next_partition.clone()));
            request.query.push(("NextRowKey", next_row.clone()));
        }
        let answer = self.send(&request).await?;
        if answer.status != StatusCode::OK {
            return Err(answer.into_error("querying a partition"));
        }
        let next = continuation_of(&answer.headers);
        Ok((answer.body, next))
    }
}

/// The OData filter of a query's partition and row bounds, on written keys.
fn filter_of(query: &Query) -> StoreResult<String> {
    let mut filter = format!(
        "PartitionKey eq {}",
        literal(&written_key(&query.partition, "partition")?)
    );
    let mut bound = |operator: &str, written: &str| {
        filter.push_str(&format!(" and RowKey {operator} {}", literal(written)));
    };
    let tag = placement(query.table).tag;
    match &query.start {
        Some(start) => bound("ge", &written_row(query.table, start)?),
        // A shared table's rows of other tables lie before and after the tag's range.
        None if !tag.is_empty() => bound("ge", tag),
        None => {}
    }
    match &query.end {
        Some(end) => bound("lt", &written_row(query.table, end)?),
        None if !tag.is_empty() => bound("lt", &tag_end(tag)),
        None => {}
    }
    if let Some(after) = &query.start_after {
        let after = written_row(query.table, after)?;
        match query.direction {
            Direction::Forward => bound("gt", &after),
            Direction::Reverse => bound("lt", &after),
        }
    }
    Ok(filter)
}

/// The continuation an answer gives, if any.
fn continuation_of(headers: &reqwest::header::HeaderMap) -> Option<(String, String)> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let partition = header("x-ms-continuation-NextPartitionKey")?;
    let row = header("x-ms-continuation-NextRowKey").unwrap_or_default();
    Some((partition, row))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_double_their_quotes() {
        assert_eq!(literal("o'neil"), "'o''neil'");
    }

    #[test]
    fn a_continuation_needs_its_partition_header() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(continuation_of(&headers), None);
        headers.insert(
            "x-ms-continuation-NextPartitionKey",
            "1!4!YQ--".parse().expect("header"),
        );
        headers.insert(
            "x-ms-continuation-NextRowKey",
            "1!4!Yg--".parse().expect("header"),
        );
        assert_eq!(
            continuation_of(&headers),
            Some(("1!4!YQ--".into(), "1!4!Yg--".into()))
        );
    }
}
