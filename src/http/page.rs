//! The one envelope of every listing, and the paging parameters most listings share.
//!
//! Every listing answers `{"items":[...],"next_cursor":string|null}`, plus the fields of its
//! own that it needs (`truncated` for timelines, [`Names`] for aligned reads), flattened
//! into the same object. All of them are [`PageResponse`], so the envelope cannot drift
//! between routes; the import client and the bench read answers with the same type.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::timeline::{MAX_PAGE_SIZE, Page, TimelineEntry};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items a page: 1 to 250; 250 when absent.
    #[param(minimum = 1, maximum = 250)]
    pub limit: Option<usize>,
    /// The `next_cursor` of the page before (a cursor this listing issued).
    #[param(value_type = Option<super::schema::Cursor>)]
    pub cursor: Option<String>,
}

impl PageParams {
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(MAX_PAGE_SIZE)
    }
}

/// `{"items":[...],"next_cursor":string|null}`, and the fields of `extra`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PageResponse<T, X = NoExtra> {
    pub items: Vec<T>,
    /// The cursor of the next page; null on the last one.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
    /// Fields of this listing's own, beside `items` and `next_cursor`.
    #[serde(flatten)]
    pub extra: X,
}

/// No fields beyond `items` and `next_cursor`.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct NoExtra {}

/// An aligned read's own field.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Names {
    /// The series read, in the order of every row's `values`.
    #[schema(value_type = Vec<super::schema::Name>)]
    pub names: Vec<String>,
}

impl<T> PageResponse<T> {
    /// A page of `items` with nothing beyond the envelope.
    pub fn new(items: Vec<T>, next_cursor: Option<String>) -> Self {
        PageResponse {
            items,
            next_cursor,
            extra: NoExtra {},
        }
    }

    /// A domain page, each item converted by `convert`.
    pub fn from_page<D>(page: Page<D>, convert: impl Fn(D) -> T) -> Self {
        PageResponse::new(
            page.items.into_iter().map(convert).collect(),
            page.next_cursor,
        )
    }
}

/// A page of stored entries, each written with its author under `author_key`, closed with
/// `next_cursor` and, for a timeline, `truncated`.
pub(crate) fn entry_page(
    items: &[TimelineEntry],
    author_key: &str,
    next_cursor: Option<&str>,
    truncated: Option<bool>,
) -> Response {
    let item_bytes = items.iter().map(|item| item.json_len(author_key) + 1).sum();
    let mut page = PageWriter::with_capacity(item_bytes);
    for item in items {
        item.write_json(author_key, page.next_item());
    }
    page.finish(next_cursor, truncated)
}

/// A catch-up answer: a timeline page of `items` (never truncated), then the entries held
/// by earlier reads that were edited since (`edited`, as they are now) and the ids of those
/// deleted since (`removed`).
pub(crate) fn catch_up_page(
    items: &[TimelineEntry],
    author_key: &str,
    next_cursor: &str,
    edited: &[TimelineEntry],
    removed: &[uuid::Uuid],
) -> Response {
    let item_bytes: usize = items
        .iter()
        .chain(edited)
        .map(|item| item.json_len(author_key) + 1)
        .sum();
    let mut page = PageWriter::with_capacity(item_bytes + removed.len() * 40);
    for item in items {
        item.write_json(author_key, page.next_item());
    }
    page.finish_with(Some(next_cursor), Some(false), |body| {
        body.extend_from_slice(br#","edited":["#);
        for (index, item) in edited.iter().enumerate() {
            if index > 0 {
                body.push(b',');
            }
            item.write_json(author_key, body);
        }
        body.extend_from_slice(br#"],"removed":"#);
        // Hyphenated UUIDs: this cannot fail.
        let _ = serde_json::to_writer(&mut *body, removed);
    })
}

/// A listing answer written by concatenation, for items already held as JSON (timeline and
/// author-log entries): the same bytes serde writes of a [`PageResponse`], without a parse
/// or a per-item allocation.
struct PageWriter {
    body: Vec<u8>,
    empty: bool,
}

impl PageWriter {
    /// A page of items that take about `item_bytes` in all.
    fn with_capacity(item_bytes: usize) -> Self {
        // The envelope: `items` and up to a 2 kB cursor and the extra fields.
        let mut body = Vec::with_capacity(item_bytes + 2048);
        body.extend_from_slice(br#"{"items":["#);
        PageWriter { body, empty: true }
    }

    /// The buffer to append the next item to, after its separator.
    fn next_item(&mut self) -> &mut Vec<u8> {
        if !std::mem::take(&mut self.empty) {
            self.body.push(b',');
        }
        &mut self.body
    }

    /// Closes the page with `next_cursor` and, for a timeline, `truncated`; answers it as
    /// `application/json`.
    fn finish(self, next_cursor: Option<&str>, truncated: Option<bool>) -> Response {
        self.finish_with(next_cursor, truncated, |_| {})
    }

    /// [`PageWriter::finish`], with more fields written by `more` before the closing brace.
    fn finish_with(
        mut self,
        next_cursor: Option<&str>,
        truncated: Option<bool>,
        more: impl FnOnce(&mut Vec<u8>),
    ) -> Response {
        self.body.extend_from_slice(br#"],"next_cursor":"#);
        // A string (escaped as serde escapes it) or null: this cannot fail.
        let _ = serde_json::to_writer(&mut self.body, &next_cursor);
        if let Some(truncated) = truncated {
            self.body.extend_from_slice(br#","truncated":"#);
            let value = if truncated { "true" } else { "false" };
            self.body.extend_from_slice(value.as_bytes());
        }
        more(&mut self.body);
        self.body.push(b'}');
        // The content type `axum::Json` answers with.
        let json = HeaderValue::from_static("application/json");
        ([(header::CONTENT_TYPE, json)], self.body).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_envelope_has_items_and_next_cursor_and_only_its_own_extra_fields() {
        let keys = |value: serde_json::Value| -> Vec<String> {
            let mut keys: Vec<String> = value
                .as_object()
                .expect("an object")
                .keys()
                .cloned()
                .collect();
            keys.sort();
            keys
        };
        let plain = serde_json::to_value(PageResponse::new(vec![1], None)).expect("json");
        assert_eq!(keys(plain), ["items", "next_cursor"]);
        let read: PageResponse<u8, Names> =
            serde_json::from_str(r#"{"items":[],"next_cursor":null,"names":["a"]}"#)
                .expect("a page reads back");
        assert_eq!(read.extra.names, ["a"]);
    }
}
