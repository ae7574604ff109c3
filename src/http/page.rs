//! Paging parameters and the page envelope shared by every listing.

use serde::{Deserialize, Serialize};

use crate::timeline::{MAX_PAGE_SIZE, Page};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageParams {
    /// 1 to 250; 250 when absent.
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

impl PageParams {
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(MAX_PAGE_SIZE)
    }
}

/// `{"items":[...],"next_cursor":string|null}`.
#[derive(Debug, Serialize)]
pub struct PageResponse<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T> PageResponse<T> {
    pub fn from_page<D>(page: Page<D>, convert: impl Fn(D) -> T) -> Self {
        PageResponse {
            items: page.items.into_iter().map(convert).collect(),
            next_cursor: page.next_cursor,
        }
    }
}
