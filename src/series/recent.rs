//! Catalogue rows the write path read lately, per series: a gateway's every request names
//! the same thousands of series, and reading each one's tags and retention again for each
//! request was two point reads a point.
//!
//! An entry is trusted for [`FRESH_FOR`], and this process forgets it at once when it
//! changes the row itself. A change made by another process (DynamoDB) reaches this one's
//! writes within [`FRESH_FOR`]: a tag it removed may be added back by a write naming it, as
//! it would have been a moment before; a retention it shortened drops expired points from
//! writes a little later (reads clamp to the retention row itself, and the sweep deletes).

use std::time::{Duration, Instant};

/// How long a row read is trusted.
pub const FRESH_FOR: Duration = Duration::from_secs(10);
/// Series remembered at most.
const CAPACITY: usize = 65_536;

/// Rows of type `V`, by series name.
pub struct Recent<V: Clone> {
    rows: quick_cache::sync::Cache<String, (V, Instant)>,
}

impl<V: Clone> Default for Recent<V> {
    fn default() -> Self {
        Recent {
            rows: quick_cache::sync::Cache::new(CAPACITY),
        }
    }
}

impl<V: Clone> Recent<V> {
    /// `series`' row, if read within [`FRESH_FOR`].
    pub fn get(&self, series: &str) -> Option<V> {
        self.rows
            .get(series)
            .filter(|(_, read_at)| read_at.elapsed() < FRESH_FOR)
            .map(|(value, _)| value)
    }

    /// Remembers `series`' row as just read (or written).
    pub fn put(&self, series: &str, value: V) {
        self.rows.insert(series.to_owned(), (value, Instant::now()));
    }

    /// Forgets `series`' row: this process is changing it.
    pub fn forget(&self, series: &str) {
        self.rows.remove(series);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_served_until_forgotten() {
        let recent: Recent<u32> = Recent::default();
        assert_eq!(recent.get("s"), None);
        recent.put("s", 7);
        assert_eq!(recent.get("s"), Some(7));
        recent.forget("s");
        assert_eq!(recent.get("s"), None);
    }
}
