//! Paging parameters and the page envelope shared by every listing.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::timeline::{MAX_PAGE_SIZE, Page};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items a page: 1 to 250; 250 when absent.
    #[param(minimum = 1, maximum = 250)]
    pub limit: Option<usize>,
    /// The `next_cursor` of the page before.
    pub cursor: Option<String>,
}

impl PageParams {
    pub fn limit(&self) -> usize {
        self.limit.unwrap_or(MAX_PAGE_SIZE)
    }
}

/// `{"items":[...],"next_cursor":string|null}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PageResponse<T> {
    pub items: Vec<T>,
    /// The cursor of the next page; null on the last one.
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
