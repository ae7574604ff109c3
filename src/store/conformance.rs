//! The conformance suite every backend passes: plain async cases over `&dyn Store`.
//!
//! [`store_conformance_tests!`](crate::store_conformance_tests) makes one test per case for a
//! backend, so a failing case never hides another. Cases use random partition keys, so
//! several runs can share one DynamoDB Local.
//!
//! Test-only: built for the crate's tests and with the `testing` feature, never in release.

#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use uuid::Uuid;

use super::{
    Condition, Item, Key, MAX_ITEM_BYTES, MAX_TRANSACTION_WRITES, Query, Store, StoreError,
    StoreExt, Table, Write, item_bytes, write_bytes,
};

/// Expands to one `#[tokio::test]` per conformance case. `$fixture` is an expression of a
/// future, evaluated afresh for each case, whose output is `(keep_alive, store)`: the store
/// to test (of any [`Store`](crate::store::Store) type) and whatever must live as long as it
/// (a temporary directory, or `()`).
///
/// ```ignore
/// mod conformance {
///     fanline::store_conformance_tests!(async { ((), connect_the_store().await) });
/// }
/// ```
#[macro_export]
macro_rules! store_conformance_tests {
    ($fixture:expr) => {
        $crate::store_conformance_tests!(@cases $fixture;
            put_then_get_round_trips_and_overwrites,
            get_of_a_missing_item_is_none,
            empty_values_round_trip,
            create_if_absent_collides_without_changing_the_item,
            compare_and_swap_needs_the_exact_current_value,
            concurrent_creates_of_one_item_have_one_winner,
            a_write_refused_by_a_condition_is_followed_by_reads_that_see_the_refusing_item,
            delete_is_idempotent_and_honours_conditions,
            transaction_writes_across_tables_and_partitions,
            transaction_with_a_failing_condition_writes_nothing,
            a_transaction_within_one_partition_applies_whole,
            compare_and_swap_goes_ahead_after_the_value_changed_and_changed_back,
            keys_with_any_character_round_trip_and_sort_by_bytes,
            values_over_64_kib_round_trip_by_every_read,
            checks_guard_a_transaction_without_writing_their_rows,
            empty_transactions_and_transactions_writing_an_item_twice_are_refused,
            a_transaction_of_the_most_writes_is_applied_and_one_more_is_refused,
            a_transaction_of_the_most_bytes_is_applied_and_one_byte_more_is_refused,
            a_put_of_the_largest_item_round_trips_and_one_byte_more_is_refused,
            a_transaction_with_the_largest_item_is_applied_and_one_byte_more_is_refused,
            a_batch_of_the_largest_items_lands_and_one_byte_more_is_refused,
            keys_at_their_size_limits_work_and_one_byte_more_is_refused,
            batch_write_of_any_size_lands_and_last_write_wins,
            batch_write_rejects_conditions,
            a_batch_then_a_conditional_write_lands_when_the_condition_holds,
            empty_keys_are_invalid_input,
            query_reads_one_partition_in_both_directions,
            query_pages_with_an_exclusive_start_key,
            query_honours_row_ranges,
            query_of_an_empty_partition_is_empty,
            query_many_answers_each_query_in_order,
            get_many_answers_each_key_in_order_across_tables_and_chunks,
            multi_byte_utf8_keys_sort_by_bytes,
            ping_answers,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (_keep_alive, store) = $fixture.await;
                $crate::store::conformance::$case(&store).await;
            }
        )*
    };
}

/// Panics unless `result` is `InvalidInput` with a message holding every one of `wanted`.
fn assert_invalid_input<T: std::fmt::Debug>(result: Result<T, StoreError>, wanted: &[&str]) {
    match result {
        Err(StoreError::InvalidInput(message)) => {
            for part in wanted {
                assert!(message.contains(part), "{message:?} does not say {part:?}");
            }
        }
        other => panic!("expected invalid input ({wanted:?}), got {other:?}"),
    }
}

/// An item of exactly `size` bytes as the store's limits count them, its value a pattern
/// (so that a value cut or shifted on the way does not compare equal).
fn item_of_size(partition: &str, row: &str, size: usize) -> Item {
    let bare = item_bytes(&Item::new(partition, row, Bytes::new()));
    let value: Vec<u8> = (0..size - bare).map(|i| (i % 251) as u8).collect();
    Item::new(partition, row, value)
}

fn partition(case: &str) -> String {
    format!("{case}-{}", Uuid::new_v4())
}

fn rows(items: &[Item]) -> Vec<&str> {
    items.iter().map(|item| item.row.as_str()).collect()
}

/// The table a case's transaction writes beside `home`: `other` where the backend commits
/// both tables' rows of one partition at once, `home` itself otherwise.
fn beside(store: &dyn Store, home: Table, other: Table) -> Table {
    let both = [
        Write::put(home, Item::new("p", "a", "v")),
        Write::put(other, Item::new("p", "b", "v")),
    ];
    if store.commits_at_once(&both) {
        other
    } else {
        home
    }
}

async fn seed(store: &dyn Store, table: Table, partition: &str, row_keys: &[&str]) {
    let writes = row_keys
        .iter()
        .map(|row| Write::put(table, Item::new(partition, *row, format!("v-{row}"))))
        .collect();
    store.batch_write(writes).await.unwrap();
}

pub async fn put_then_get_round_trips_and_overwrites(store: &dyn Store) {
    let p = partition("put");
    store
        .put(Table::Events, Item::new(&p, "r1", "one"), Condition::None)
        .await
        .unwrap();
    assert_eq!(
        store.get(Table::Events, &p, "r1").await.unwrap(),
        Some(Bytes::from("one"))
    );
    store
        .put(Table::Events, Item::new(&p, "r1", "two"), Condition::None)
        .await
        .unwrap();
    assert_eq!(
        store.get(Table::Events, &p, "r1").await.unwrap(),
        Some(Bytes::from("two"))
    );
    // Tables are separate namespaces.
    assert_eq!(store.get(Table::Timelines, &p, "r1").await.unwrap(), None);
}

pub async fn get_of_a_missing_item_is_none(store: &dyn Store) {
    let p = partition("missing");
    assert_eq!(store.get(Table::Events, &p, "nothing").await.unwrap(), None);
}

pub async fn empty_values_round_trip(store: &dyn Store) {
    let p = partition("empty-value");
    store
        .put(
            Table::Meta,
            Item::new(&p, "r", Bytes::new()),
            Condition::None,
        )
        .await
        .unwrap();
    assert_eq!(
        store.get(Table::Meta, &p, "r").await.unwrap(),
        Some(Bytes::new())
    );
}

pub async fn create_if_absent_collides_without_changing_the_item(store: &dyn Store) {
    let p = partition("absent");
    store
        .put(
            Table::Idempotency,
            Item::new(&p, "id", "first"),
            Condition::Absent,
        )
        .await
        .unwrap();
    let second = store
        .put(
            Table::Idempotency,
            Item::new(&p, "id", "second"),
            Condition::Absent,
        )
        .await;
    assert!(
        matches!(second, Err(StoreError::ConditionFailed)),
        "{second:?}"
    );
    assert!(!second.unwrap_err().is_retryable());
    assert_eq!(
        store.get(Table::Idempotency, &p, "id").await.unwrap(),
        Some(Bytes::from("first"))
    );
}

pub async fn compare_and_swap_needs_the_exact_current_value(store: &dyn Store) {
    let p = partition("cas");
    let missing = store
        .put(
            Table::Jobs,
            Item::new(&p, "job", "a"),
            Condition::Equals("x".into()),
        )
        .await;
    assert!(
        matches!(missing, Err(StoreError::ConditionFailed)),
        "{missing:?}"
    );
    assert_eq!(store.get(Table::Jobs, &p, "job").await.unwrap(), None);

    store
        .put(Table::Jobs, Item::new(&p, "job", "a"), Condition::None)
        .await
        .unwrap();
    let stale = store
        .put(
            Table::Jobs,
            Item::new(&p, "job", "c"),
            Condition::Equals("b".into()),
        )
        .await;
    assert!(
        matches!(stale, Err(StoreError::ConditionFailed)),
        "{stale:?}"
    );
    store
        .put(
            Table::Jobs,
            Item::new(&p, "job", "b"),
            Condition::Equals("a".into()),
        )
        .await
        .unwrap();
    assert_eq!(
        store.get(Table::Jobs, &p, "job").await.unwrap(),
        Some(Bytes::from("b"))
    );
}

pub async fn concurrent_creates_of_one_item_have_one_winner(store: &dyn Store) {
    let p = &partition("race");
    // Unconditional writes to the same item race with the conditional ones.
    let attempts = (0..16).map(|i| async move {
        if i % 4 == 0 {
            store
                .batch_write(vec![Write::put(
                    Table::Meta,
                    Item::new(p.as_str(), format!("other{i}"), "x"),
                )])
                .await
                .unwrap();
            return false;
        }
        let item = Item::new(p.as_str(), "prize", format!("winner-{i}"));
        match store.put(Table::Meta, item, Condition::Absent).await {
            Ok(()) => true,
            Err(StoreError::ConditionFailed) => false,
            Err(err) => panic!("unexpected {err:?}"),
        }
    });
    let results = futures::future::join_all(attempts).await;
    assert_eq!(results.iter().filter(|won| **won).count(), 1, "{results:?}");
    let all = store
        .query(Query::partition(Table::Meta, p.as_str(), 100))
        .await
        .unwrap();
    assert_eq!(all.len(), 5);
}

/// A write refused by a condition is answered only once the item that refused it can be read:
/// a client that retries with the same idempotency key and then reads the key finds the
/// first write, not nothing (the embedded store once answered before committing the group
/// that held the winner). Large batches sent before and after the contenders make a backend
/// that groups writes take them in one group and take its time committing it.
pub async fn a_write_refused_by_a_condition_is_followed_by_reads_that_see_the_refusing_item(
    store: &dyn Store,
) {
    let p = &partition("refused");
    let bulk = |name: &str| {
        (0..4)
            .map(|i| {
                Write::put(
                    Table::Meta,
                    item_of_size(p, &format!("{name}-{i}"), 250_000),
                )
            })
            .collect::<Vec<_>>()
    };
    for round in 0..10 {
        let row = &format!("key-{round}");
        let contenders = (0..16).map(|i| async move {
            let value = format!("attempt-{i}");
            let writes = vec![
                Write::put_if_absent(Table::Idempotency, Item::new(p.as_str(), row, value)),
                Write::put(
                    beside(store, Table::Idempotency, Table::Events),
                    Item::new(p.as_str(), format!("{row}-event-{i}"), "e"),
                ),
            ];
            match store.transact(writes).await {
                Ok(()) => None,
                Err(StoreError::ConditionFailed) => {
                    Some(store.get(Table::Idempotency, p, row).await.unwrap())
                }
                Err(err) => panic!("unexpected {err:?}"),
            }
        });
        let (_, results, _) = futures::join!(
            store.batch_write(bulk("before")),
            futures::future::join_all(contenders),
            store.batch_write(bulk("after")),
        );
        assert_eq!(
            results.iter().filter(|seen| seen.is_none()).count(),
            1,
            "round {round}: {results:?}"
        );
        let winner = store.get(Table::Idempotency, p, row).await.unwrap();
        assert!(winner.is_some(), "round {round}");
        for seen in results.into_iter().flatten() {
            assert_eq!(
                seen, winner,
                "round {round}: a refused write read no winner"
            );
        }
    }
}

pub async fn delete_is_idempotent_and_honours_conditions(store: &dyn Store) {
    let p = partition("delete");
    store
        .put(Table::Jobs, Item::new(&p, "r", "v1"), Condition::None)
        .await
        .unwrap();
    let wrong = store
        .delete(Table::Jobs, &p, "r", Condition::Equals("other".into()))
        .await;
    assert!(
        matches!(wrong, Err(StoreError::ConditionFailed)),
        "{wrong:?}"
    );
    assert!(store.get(Table::Jobs, &p, "r").await.unwrap().is_some());
    store
        .delete(Table::Jobs, &p, "r", Condition::Equals("v1".into()))
        .await
        .unwrap();
    assert_eq!(store.get(Table::Jobs, &p, "r").await.unwrap(), None);
    store
        .delete(Table::Jobs, &p, "r", Condition::None)
        .await
        .unwrap();
}

pub async fn transaction_writes_across_tables_and_partitions(store: &dyn Store) {
    let (a, b) = (partition("tx-a"), partition("tx-b"));
    store
        .put(
            Table::SubjectFollowing,
            Item::new(&b, "gone", "x"),
            Condition::None,
        )
        .await
        .unwrap();
    let writes = vec![
        Write::put_if_absent(Table::SubjectFollowers, Item::new(&a, &b, "since")),
        Write::put(Table::SubjectFollowing, Item::new(&b, &a, "since")),
        Write::delete(Table::SubjectFollowing, &b, "gone"),
    ];
    let at_once = store.commits_at_once(&writes);
    let across = store.transact(writes).await;
    let followers = store.get(Table::SubjectFollowers, &a, &b).await.unwrap();
    let following = store.get(Table::SubjectFollowing, &b, &a).await.unwrap();
    let gone = store
        .get(Table::SubjectFollowing, &b, "gone")
        .await
        .unwrap();
    match at_once {
        true => {
            across.unwrap();
            assert!(followers.is_some() && following.is_some());
            assert_eq!(gone, None);
        }
        // The backend itself refuses what it cannot commit at once, and writes nothing.
        false => {
            assert_invalid_input(across, &["atomic scope"]);
            assert!(followers.is_none() && following.is_none());
            assert_eq!(gone, Some(Bytes::from("x")));
        }
    }
}

pub async fn a_transaction_within_one_partition_applies_whole(store: &dyn Store) {
    let p = partition("tx-one");
    store
        .put(
            Table::SubjectFollowers,
            Item::new(&p, "gone", "x"),
            Condition::None,
        )
        .await
        .unwrap();
    let mut writes = vec![
        Write::put_if_absent(Table::SubjectFollowers, Item::new(&p, "new", "since")),
        Write::put(Table::SubjectFollowers, Item::new(&p, "other", "since")),
        Write::delete(Table::SubjectFollowers, &p, "gone"),
    ];
    // Deleting rows that are absent is no failure, however many (a cleanup's).
    writes.extend((0..20).map(|i| Write::delete(Table::SubjectFollowers, &p, format!("never{i}"))));
    store.transact(writes).await.unwrap();
    let rows_now = store
        .query(Query::partition(Table::SubjectFollowers, &p, 10))
        .await
        .unwrap();
    assert_eq!(rows(&rows_now), ["new", "other"]);
}

pub async fn transaction_with_a_failing_condition_writes_nothing(store: &dyn Store) {
    let p = partition("tx-fail");
    let jobs = beside(store, Table::Idempotency, Table::Jobs);
    let events = beside(store, Table::Idempotency, Table::Events);
    store
        .put(
            Table::Idempotency,
            Item::new(&p, "taken", "first"),
            Condition::None,
        )
        .await
        .unwrap();
    store
        .put(jobs, Item::new(&p, "doomed", "keep"), Condition::None)
        .await
        .unwrap();
    let result = store
        .transact(vec![
            Write::put(events, Item::new(&p, "event", "e")),
            Write::delete(jobs, &p, "doomed"),
            Write::put_if_absent(Table::Idempotency, Item::new(&p, "taken", "second")),
        ])
        .await;
    assert!(
        matches!(result, Err(StoreError::ConditionFailed)),
        "{result:?}"
    );
    assert_eq!(store.get(events, &p, "event").await.unwrap(), None);
    assert_eq!(
        store.get(jobs, &p, "doomed").await.unwrap(),
        Some(Bytes::from("keep"))
    );
    assert_eq!(
        store.get(Table::Idempotency, &p, "taken").await.unwrap(),
        Some(Bytes::from("first"))
    );
}

pub async fn checks_guard_a_transaction_without_writing_their_rows(store: &dyn Store) {
    let p = partition("tx-check");
    let events = beside(store, Table::MergedAuthors, Table::Events);
    let absence_checks = store.commits_at_once(&[
        Write::put(events, Item::new(&p, "first", "e")),
        Write::check(
            Key::new(Table::MergedAuthors, &p, "flag"),
            Condition::Absent,
        ),
    ]);
    store
        .put(
            Table::MergedAuthors,
            Item::new(&p, "mark", "v1"),
            Condition::None,
        )
        .await
        .unwrap();
    let mark = || Key::new(Table::MergedAuthors, &p, "mark");
    let missing = || Key::new(Table::MergedAuthors, &p, "flag");
    // Both hold: the put lands, and neither checked row is written. A backend that commits
    // one partition cannot check that a row is absent beside a write, and says so.
    let mut guarded = vec![
        Write::put(events, Item::new(&p, "first", "e")),
        Write::check(mark(), Condition::Equals("v1".into())),
    ];
    let absent = Write::check(missing(), Condition::Absent);
    if absence_checks {
        guarded.push(absent);
    } else {
        let mut beyond = guarded.clone();
        beyond.push(absent.clone());
        assert_invalid_input(store.transact(beyond).await, &["atomic scope", "absent"]);
        // Alone, checks are reads.
        store.transact(vec![absent]).await.unwrap();
    }
    store.transact(guarded).await.unwrap();
    assert_eq!(
        store.get(events, &p, "first").await.unwrap(),
        Some(Bytes::from("e"))
    );
    assert_eq!(
        store.get(Table::MergedAuthors, &p, "mark").await.unwrap(),
        Some(Bytes::from("v1"))
    );
    assert_eq!(
        store.get(Table::MergedAuthors, &p, "flag").await.unwrap(),
        None
    );
    // The mark moved (and moved back is another test's business): the check fails the
    // transaction, and so does a check that a present row is absent.
    store
        .put(
            Table::MergedAuthors,
            Item::new(&p, "mark", "v2"),
            Condition::None,
        )
        .await
        .unwrap();
    let mut guards = vec![
        Write::check(mark(), Condition::Equals("v1".into())),
        Write::check(missing(), Condition::Equals("v1".into())),
    ];
    if absence_checks {
        guards.push(Write::check(mark(), Condition::Absent));
    }
    for guard in guards {
        let refused = store
            .transact(vec![
                Write::put(events, Item::new(&p, "second", "e")),
                guard.clone(),
            ])
            .await;
        assert!(
            matches!(refused, Err(StoreError::ConditionFailed)),
            "{guard:?}: {refused:?}"
        );
        assert_eq!(store.get(events, &p, "second").await.unwrap(), None);
    }
    // A check writes nothing, so it has no place in a batch, nor without a condition.
    let batched = store
        .batch_write(vec![Write::check(mark(), Condition::Absent)])
        .await;
    assert!(
        matches!(batched, Err(StoreError::InvalidInput(_))),
        "{batched:?}"
    );
    let unconditional = store
        .transact(vec![Write::check(mark(), Condition::None)])
        .await;
    assert!(
        matches!(unconditional, Err(StoreError::InvalidInput(_))),
        "{unconditional:?}"
    );
}

pub async fn empty_transactions_and_transactions_writing_an_item_twice_are_refused(
    store: &dyn Store,
) {
    let p = partition("tx-shape");
    let empty = store.transact(Vec::new()).await;
    assert_invalid_input(empty, &["1 to 100 writes", "got 0"]);
    let duplicate = store
        .transact(vec![
            Write::put(Table::Events, Item::new(&p, "same", "1")),
            Write::delete(Table::Events, &p, "same"),
        ])
        .await;
    assert_invalid_input(duplicate, &["at most once"]);
    assert_eq!(store.get(Table::Events, &p, "same").await.unwrap(), None);
}

pub async fn a_transaction_of_the_most_writes_is_applied_and_one_more_is_refused(
    store: &dyn Store,
) {
    let p = partition("tx-count");
    let writes = |n: usize| {
        (0..n)
            .map(|i| Write::put(Table::Events, Item::new(&p, format!("r{i:03}"), "v")))
            .collect::<Vec<_>>()
    };
    let too_many = store.transact(writes(MAX_TRANSACTION_WRITES + 1)).await;
    assert_invalid_input(too_many, &["1 to 100 writes", "got 101"]);
    assert_eq!(store.get(Table::Events, &p, "r000").await.unwrap(), None);
    store
        .transact(writes(MAX_TRANSACTION_WRITES))
        .await
        .unwrap();
    let all = store
        .query_all(Query::partition(Table::Events, &p, 1000))
        .await
        .unwrap();
    assert_eq!(all.len(), MAX_TRANSACTION_WRITES);
}

pub async fn a_transaction_of_the_most_bytes_is_applied_and_one_byte_more_is_refused(
    store: &dyn Store,
) {
    let p = partition("tx-bytes");
    let most = store.limits().transaction_bytes;
    // Items of the largest size, as many as leave room for the rest.
    let full = (most
        / write_bytes(&Write::put(
            Table::SeriesBatches,
            item_of_size(&p, "full0", MAX_ITEM_BYTES),
        )))
    .clamp(1, 10);
    store
        .put(
            Table::SeriesBatches,
            Item::new(&p, "swap", "old"),
            Condition::None,
        )
        .await
        .unwrap();
    // Items of the largest size (one created if absent), a delete, a compare-and-swap delete
    // (conditions count too); a last put brings the total to the limit.
    let mut writes: Vec<Write> = (0..full)
        .map(|i| {
            let row = format!("full{i}");
            Write::put(Table::SeriesBatches, item_of_size(&p, &row, MAX_ITEM_BYTES))
        })
        .collect();
    if let Some(Write::Put { condition, .. }) = writes.last_mut() {
        *condition = Condition::Absent;
    }
    writes.push(Write::delete(Table::SeriesBatches, &p, "gone"));
    writes.push(Write::Delete {
        table: Table::SeriesBatches,
        partition: p.clone(),
        row: "swap".into(),
        condition: Condition::Equals("old".into()),
    });
    let used: usize = writes.iter().map(write_bytes).sum();
    let with_last = |last_bytes: usize| {
        let mut all = writes.clone();
        all.push(Write::put(
            Table::SeriesBatches,
            item_of_size(&p, "last", last_bytes),
        ));
        all
    };

    let over = store.transact(with_last(most - used + 1)).await;
    let over_bytes = format!("{} bytes", most + 1);
    let limit = most.to_string();
    assert_invalid_input(over, &["transaction too large", &over_bytes, &limit]);
    assert_eq!(
        store.get(Table::SeriesBatches, &p, "full0").await.unwrap(),
        None
    );
    assert!(
        store
            .get(Table::SeriesBatches, &p, "swap")
            .await
            .unwrap()
            .is_some()
    );

    let at_limit = with_last(most - used);
    assert_eq!(at_limit.iter().map(write_bytes).sum::<usize>(), most);
    store.transact(at_limit.clone()).await.unwrap();
    assert_eq!(
        store.get(Table::SeriesBatches, &p, "swap").await.unwrap(),
        None
    );
    for write in &at_limit {
        if let Write::Put { item, .. } = write {
            let stored = store
                .get(Table::SeriesBatches, &p, &item.row)
                .await
                .unwrap();
            assert_eq!(stored.as_ref(), Some(&item.value), "row {}", item.row);
        }
    }
}

pub async fn a_put_of_the_largest_item_round_trips_and_one_byte_more_is_refused(store: &dyn Store) {
    let p = partition("item-put");
    let over = store
        .put(
            Table::Events,
            item_of_size(&p, "over", MAX_ITEM_BYTES + 1),
            Condition::None,
        )
        .await;
    assert_invalid_input(over, &["item too large", "409601 bytes", "409600"]);
    assert_eq!(store.get(Table::Events, &p, "over").await.unwrap(), None);

    let largest = item_of_size(&p, "largest", MAX_ITEM_BYTES);
    store
        .put(Table::Events, largest.clone(), Condition::Absent)
        .await
        .unwrap();
    assert_eq!(
        store.get(Table::Events, &p, "largest").await.unwrap(),
        Some(largest.value)
    );
}

pub async fn a_transaction_with_the_largest_item_is_applied_and_one_byte_more_is_refused(
    store: &dyn Store,
) {
    let p = partition("item-tx");
    let over = store
        .transact(vec![
            Write::put(Table::Events, Item::new(&p, "small", "v")),
            Write::put(Table::Events, item_of_size(&p, "big", MAX_ITEM_BYTES + 1)),
        ])
        .await;
    assert_invalid_input(over, &["item too large", "409601 bytes", "409600"]);
    assert_eq!(store.get(Table::Events, &p, "small").await.unwrap(), None);

    let largest = item_of_size(&p, "big", MAX_ITEM_BYTES);
    store
        .transact(vec![
            Write::put_if_absent(Table::Events, Item::new(&p, "small", "v")),
            Write::put_if_absent(Table::Events, largest.clone()),
        ])
        .await
        .unwrap();
    assert_eq!(
        store.get(Table::Events, &p, "big").await.unwrap(),
        Some(largest.value)
    );
}

pub async fn a_batch_of_the_largest_items_lands_and_one_byte_more_is_refused(store: &dyn Store) {
    let p = partition("item-batch");
    let largest = |i: usize| {
        let row = format!("r{i:02}");
        Write::put(Table::Timelines, item_of_size(&p, &row, MAX_ITEM_BYTES))
    };
    let mut over: Vec<Write> = (0..3).map(largest).collect();
    over.push(Write::put(
        Table::Timelines,
        item_of_size(&p, "over", MAX_ITEM_BYTES + 1),
    ));
    let refused = store.batch_write(over).await;
    assert_invalid_input(refused, &["item too large", "409601 bytes", "409600"]);
    // The batch is checked whole before anything is written.
    assert_eq!(store.get(Table::Timelines, &p, "r00").await.unwrap(), None);

    // More than one `BatchWriteItem` (25 items) of the largest items.
    let writes: Vec<Write> = (0..30).map(largest).collect();
    store.batch_write(writes.clone()).await.unwrap();
    let stored = store
        .query_all(Query::partition(Table::Timelines, &p, 10))
        .await
        .unwrap();
    assert_eq!(stored.len(), 30);
    for (write, item) in writes.iter().zip(&stored) {
        let Write::Put { item: written, .. } = write else {
            unreachable!("only puts")
        };
        assert_eq!(item, written);
    }
}

pub async fn keys_at_their_size_limits_work_and_one_byte_more_is_refused(store: &dyn Store) {
    let limits = store.limits();
    let unique = Uuid::new_v4().simple().to_string();
    let longest_partition = format!(
        "{unique}{}",
        "p".repeat(limits.partition_key_bytes - unique.len())
    );
    // Multi-byte characters count as their UTF-8 bytes.
    let longest_row = "é".repeat(limits.row_key_bytes / 2);
    assert_eq!(longest_row.len(), limits.row_key_bytes);
    store
        .put(
            Table::Events,
            Item::new(&longest_partition, &longest_row, "v"),
            Condition::None,
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .get(Table::Events, &longest_partition, &longest_row)
            .await
            .unwrap(),
        Some(Bytes::from("v"))
    );
    let read = store
        .query(
            Query::partition(Table::Events, &longest_partition, 10)
                .range(Some(longest_row.clone()), None),
        )
        .await
        .unwrap();
    assert_eq!(rows(&read), [longest_row.as_str()]);

    let partition_over = format!("{longest_partition}p");
    let row_over = format!("{longest_row}r");
    let put = store
        .put(
            Table::Events,
            Item::new(&partition_over, "r", "v"),
            Condition::None,
        )
        .await;
    let partition_bytes = limits.partition_key_bytes;
    let over_bytes = format!("{} bytes", partition_bytes + 1);
    let limit = partition_bytes.to_string();
    assert_invalid_input(put, &["partition key too long", &over_bytes, &limit]);
    let get = store
        .get(Table::Events, &longest_partition, &row_over)
        .await;
    let over_bytes = format!("{} bytes", limits.row_key_bytes + 1);
    let limit = limits.row_key_bytes.to_string();
    assert_invalid_input(get, &["row key too long", &over_bytes, &limit]);
    let delete = store
        .transact(vec![Write::delete(Table::Events, &partition_over, "r")])
        .await;
    assert_invalid_input(delete, &["partition key too long"]);
    let batch = store
        .batch_write(vec![Write::put(
            Table::Events,
            Item::new(&longest_partition, &row_over, "v"),
        )])
        .await;
    assert_invalid_input(batch, &["row key too long"]);
    let query = store
        .query(Query::partition(Table::Events, &partition_over, 10))
        .await;
    assert_invalid_input(query, &["partition key too long"]);
    let query_after = store
        .query(Query::partition(Table::Events, &longest_partition, 10).after(Some(row_over)))
        .await;
    assert_invalid_input(query_after, &["row key too long"]);
}

pub async fn batch_write_of_any_size_lands_and_last_write_wins(store: &dyn Store) {
    let (a, b) = (partition("batch-a"), partition("batch-b"));
    let mut writes: Vec<Write> = (0..1234)
        .map(|i| {
            let owner = if i % 2 == 0 { &a } else { &b };
            Write::put(
                Table::Timelines,
                Item::new(owner, format!("r{i:05}"), "first"),
            )
        })
        .collect();
    writes.push(Write::put(
        Table::Timelines,
        Item::new(&a, "r00000", "last"),
    ));
    writes.push(Write::delete(Table::Timelines, &b, "r00001"));
    store.batch_write(writes).await.unwrap();
    store.batch_write(Vec::new()).await.unwrap();

    let in_a = store
        .query_all(Query::partition(Table::Timelines, &a, 500))
        .await
        .unwrap();
    let in_b = store
        .query_all(Query::partition(Table::Timelines, &b, 500))
        .await
        .unwrap();
    assert_eq!(in_a.len(), 617);
    assert_eq!(in_b.len(), 616);
    assert_eq!(in_a[0].value, Bytes::from("last"));
    assert_eq!(in_b[0].row, "r00003");
}

pub async fn batch_write_rejects_conditions(store: &dyn Store) {
    let p = partition("batch-cond");
    let result = store
        .batch_write(vec![Write::put_if_absent(
            Table::Events,
            Item::new(&p, "r", "v"),
        )])
        .await;
    assert!(
        matches!(result, Err(StoreError::InvalidInput(_))),
        "{result:?}"
    );
    assert_eq!(store.get(Table::Events, &p, "r").await.unwrap(), None);
}

pub async fn a_batch_then_a_conditional_write_lands_when_the_condition_holds(store: &dyn Store) {
    let (p, job) = (partition("ahead"), partition("ahead-job"));
    let batch = |tag: &str| -> Vec<Write> {
        (0..60)
            .map(|i| {
                Write::put(
                    Table::Timelines,
                    Item::new(&p, format!("r{i:03}"), tag.to_owned()),
                )
            })
            .collect()
    };
    store
        .put(Table::Jobs, Item::new(&job, "j", "v1"), Condition::None)
        .await
        .unwrap();
    let checkpoint = |from: &str, to: &str| Write::Put {
        table: Table::Jobs,
        item: Item::new(&job, "j", to.to_owned()),
        condition: Condition::Equals(Bytes::from(from.to_owned())),
    };
    store
        .batch_write_then(batch("first"), checkpoint("v1", "v2"))
        .await
        .unwrap();
    let rows = store
        .query_all(Query::partition(Table::Timelines, &p, 100))
        .await
        .unwrap();
    assert_eq!(rows.len(), 60);
    assert!(rows.iter().all(|item| item.value == "first"));
    assert_eq!(
        store.get(Table::Jobs, &job, "j").await.unwrap(),
        Some(Bytes::from("v2"))
    );

    // A stale condition is refused and leaves `last`'s item as it was (the batch may land).
    let refused = store
        .batch_write_then(batch("second"), checkpoint("v1", "v3"))
        .await;
    assert!(
        matches!(refused, Err(StoreError::ConditionFailed)),
        "{refused:?}"
    );
    assert_eq!(
        store.get(Table::Jobs, &job, "j").await.unwrap(),
        Some(Bytes::from("v2"))
    );

    // A conditional write in the batch is bad input, and nothing is written.
    let bad = store
        .batch_write_then(
            vec![Write::put_if_absent(Table::Events, Item::new(&p, "r", "v"))],
            checkpoint("v2", "v4"),
        )
        .await;
    assert_invalid_input(bad, &["unconditional"]);
    assert_eq!(store.get(Table::Events, &p, "r").await.unwrap(), None);
    assert_eq!(
        store.get(Table::Jobs, &job, "j").await.unwrap(),
        Some(Bytes::from("v2"))
    );
}

pub async fn empty_keys_are_invalid_input(store: &dyn Store) {
    let put = store
        .put(Table::Events, Item::new("", "r", "v"), Condition::None)
        .await;
    assert!(matches!(put, Err(StoreError::InvalidInput(_))), "{put:?}");
    let get = store.get(Table::Events, "p", "").await;
    assert!(matches!(get, Err(StoreError::InvalidInput(_))), "{get:?}");
    let query = store.query(Query::partition(Table::Events, "", 10)).await;
    assert!(
        matches!(query, Err(StoreError::InvalidInput(_))),
        "{query:?}"
    );
}

pub async fn query_reads_one_partition_in_both_directions(store: &dyn Store) {
    let p = partition("query");
    // A partition whose key extends ours must not leak into it.
    let neighbour = format!("{p}x");
    seed(store, Table::Events, &p, &["b", "a", "d", "c"]).await;
    seed(store, Table::Events, &neighbour, &["a", "z"]).await;

    let forward = store
        .query(Query::partition(Table::Events, &p, 10))
        .await
        .unwrap();
    assert_eq!(rows(&forward), ["a", "b", "c", "d"]);
    assert_eq!(&*forward[0].partition, p);
    assert_eq!(forward[0].value, Bytes::from("v-a"));
    let reverse = store
        .query(Query::partition(Table::Events, &p, 10).reverse())
        .await
        .unwrap();
    assert_eq!(rows(&reverse), ["d", "c", "b", "a"]);
    let limited = store
        .query(Query::partition(Table::Events, &p, 2).reverse())
        .await
        .unwrap();
    assert_eq!(rows(&limited), ["d", "c"]);
    let none = store
        .query(Query::partition(Table::Events, &p, 0))
        .await
        .unwrap();
    assert!(none.is_empty());
}

pub async fn query_pages_with_an_exclusive_start_key(store: &dyn Store) {
    let p = partition("paging");
    seed(store, Table::Timelines, &p, &["1", "2", "3", "4", "5"]).await;
    let page = store
        .query(Query::partition(Table::Timelines, &p, 2).after(Some("2".into())))
        .await
        .unwrap();
    assert_eq!(rows(&page), ["3", "4"]);
    let back = store
        .query(
            Query::partition(Table::Timelines, &p, 10)
                .reverse()
                .after(Some("4".into())),
        )
        .await
        .unwrap();
    assert_eq!(rows(&back), ["3", "2", "1"]);
    // The start key need not exist.
    let between = store
        .query(Query::partition(Table::Timelines, &p, 10).after(Some("25".into())))
        .await
        .unwrap();
    assert_eq!(rows(&between), ["3", "4", "5"]);
    let past_end = store
        .query(Query::partition(Table::Timelines, &p, 10).after(Some("5".into())))
        .await
        .unwrap();
    assert!(past_end.is_empty());
    let all = store
        .query_all(Query::partition(Table::Timelines, &p, 2))
        .await
        .unwrap();
    assert_eq!(rows(&all), ["1", "2", "3", "4", "5"]);
}

pub async fn query_honours_row_ranges(store: &dyn Store) {
    let p = partition("range");
    seed(store, Table::Events, &p, &["a", "b", "c", "d", "e"]).await;
    let range = |start: Option<&str>, end: Option<&str>| {
        Query::partition(Table::Events, &p, 10).range(start.map(Into::into), end.map(Into::into))
    };
    let mid = store.query(range(Some("b"), Some("d"))).await.unwrap();
    assert_eq!(rows(&mid), ["b", "c"], "start is inclusive, end exclusive");
    let mid_reverse = store
        .query(range(Some("b"), Some("d")).reverse())
        .await
        .unwrap();
    assert_eq!(rows(&mid_reverse), ["c", "b"]);
    let from = store.query(range(Some("d"), None)).await.unwrap();
    assert_eq!(rows(&from), ["d", "e"]);
    let to = store.query(range(None, Some("b"))).await.unwrap();
    assert_eq!(rows(&to), ["a"]);
    let limited = store
        .query(Query {
            limit: 1,
            ..range(Some("b"), Some("e")).reverse()
        })
        .await
        .unwrap();
    assert_eq!(rows(&limited), ["d"]);
    let paged = store
        .query(range(Some("a"), Some("e")).after(Some("b".into())))
        .await
        .unwrap();
    assert_eq!(rows(&paged), ["c", "d"]);
    let empty = store.query(range(Some("c"), Some("c"))).await.unwrap();
    assert!(empty.is_empty());
    let reversed = store.query(range(Some("d"), Some("b"))).await.unwrap();
    assert!(reversed.is_empty());
}

pub async fn query_of_an_empty_partition_is_empty(store: &dyn Store) {
    let p = partition("nobody");
    for query in [
        Query::partition(Table::Timelines, &p, 250),
        Query::partition(Table::Timelines, &p, 250).reverse(),
        Query::partition(Table::Timelines, &p, 250).after(Some("x".into())),
    ] {
        assert!(store.query(query).await.unwrap().is_empty());
    }
}

pub async fn query_many_answers_each_query_in_order(store: &dyn Store) {
    let p = partition("many");
    let q = partition("many");
    seed(store, Table::Events, &p, &["a", "b", "c"]).await;
    seed(store, Table::Timelines, &q, &["x", "y"]).await;
    let answers = store
        .query_many(vec![
            Query::partition(Table::Timelines, &q, 10).reverse(),
            Query::partition(Table::Events, &p, 2).after(Some("a".into())),
            Query::partition(Table::Events, partition("nobody"), 10),
            Query::partition(Table::Events, &p, 1),
        ])
        .await
        .unwrap();
    let answers: Vec<Vec<&str>> = answers.iter().map(|items| rows(items)).collect();
    assert_eq!(
        answers,
        [vec!["y", "x"], vec!["b", "c"], vec![], vec!["a"]],
        "one answer per query, in the order asked"
    );
    assert!(store.query_many(Vec::new()).await.unwrap().is_empty());
    let invalid = store
        .query_many(vec![
            Query::partition(Table::Events, &p, 1),
            Query::partition(Table::Events, "", 1),
        ])
        .await;
    assert!(
        matches!(invalid, Err(StoreError::InvalidInput(_))),
        "{invalid:?}"
    );
}

pub async fn get_many_answers_each_key_in_order_across_tables_and_chunks(store: &dyn Store) {
    let p = partition("get-many");
    let q = partition("get-many");
    // More keys than one DynamoDB request takes, so the answer spans requests.
    let rows_written: Vec<String> = (0..150).map(|i| format!("r{i:03}")).collect();
    let written: Vec<&str> = rows_written.iter().map(String::as_str).collect();
    seed(store, Table::Events, &p, &written).await;
    store
        .put(
            Table::Timelines,
            Item::new(&q, "x", "timeline x"),
            Condition::None,
        )
        .await
        .unwrap();
    let mut keys = vec![
        Key::new(Table::Timelines, &q, "x"),
        Key::new(Table::Events, &p, "missing"),
        Key::new(Table::Timelines, &p, "r000"),
        Key::new(Table::Events, &p, "r007"),
        Key::new(Table::Events, &p, "r007"),
    ];
    keys.extend(written.iter().map(|row| Key::new(Table::Events, &p, *row)));
    let answers = store.get_many(keys).await.unwrap();
    assert_eq!(answers.len(), 155, "one answer per key asked");
    assert_eq!(answers[0].as_deref(), Some(&b"timeline x"[..]));
    assert_eq!(answers[1], None, "a missing item is None");
    assert_eq!(
        answers[2], None,
        "the same key in another table is another item"
    );
    assert_eq!(
        answers[3], answers[4],
        "a key asked twice is answered twice"
    );
    for (row, answer) in written.iter().zip(&answers[5..]) {
        assert_eq!(
            answer.as_deref(),
            Some(format!("v-{row}").as_bytes()),
            "row {row}"
        );
    }
    assert!(store.get_many(Vec::new()).await.unwrap().is_empty());
    let invalid = store
        .get_many(vec![
            Key::new(Table::Events, &p, "r000"),
            Key::new(Table::Events, "", "r"),
        ])
        .await;
    assert!(
        matches!(invalid, Err(StoreError::InvalidInput(_))),
        "{invalid:?}"
    );
}

pub async fn multi_byte_utf8_keys_sort_by_bytes(store: &dyn Store) {
    let p = format!("ünïcødé-日本-{}", Uuid::new_v4());
    // UTF-8 byte order: ASCII < 2-byte < 3-byte < 4-byte sequences.
    seed(
        store,
        Table::SubjectFollowers,
        &p,
        &["𝄞clef", "zeta", "émile", "€uro", "alpha"],
    )
    .await;
    let forward = store
        .query(Query::partition(Table::SubjectFollowers, &p, 10))
        .await
        .unwrap();
    assert_eq!(rows(&forward), ["alpha", "zeta", "émile", "€uro", "𝄞clef"]);
    assert_eq!(&*forward[0].partition, p);
    let after = store
        .query(Query::partition(Table::SubjectFollowers, &p, 10).after(Some("émile".into())))
        .await
        .unwrap();
    assert_eq!(rows(&after), ["€uro", "𝄞clef"]);
    assert_eq!(
        store
            .get(Table::SubjectFollowers, &p, "€uro")
            .await
            .unwrap(),
        Some(Bytes::from("v-€uro"))
    );
}

pub async fn compare_and_swap_goes_ahead_after_the_value_changed_and_changed_back(
    store: &dyn Store,
) {
    let p = partition("aba");
    store
        .put(Table::Markers, Item::new(&p, "m", "a"), Condition::None)
        .await
        .unwrap();
    store
        .put(Table::Markers, Item::new(&p, "m", "b"), Condition::None)
        .await
        .unwrap();
    store
        .put(Table::Markers, Item::new(&p, "m", "a"), Condition::None)
        .await
        .unwrap();
    // The contract compares values, not versions.
    let swap = |to: &str| Write::Put {
        table: Table::Markers,
        item: Item::new(&p, "m", to.to_owned()),
        condition: Condition::Equals("a".into()),
    };
    store.write_one(swap("c")).await.unwrap();
    store
        .put(Table::Markers, Item::new(&p, "m", "a"), Condition::None)
        .await
        .unwrap();
    store.transact(vec![swap("d")]).await.unwrap();
    assert_eq!(
        store.get(Table::Markers, &p, "m").await.unwrap(),
        Some(Bytes::from("d"))
    );
}

/// Every character a key may hold, those some backends cannot store as they are among them
/// (`/ \ # ?`, control characters, characters beyond U+FFFF), round-trips, and keys keep the
/// byte order of their UTF-8 in queries and range bounds.
pub async fn keys_with_any_character_round_trip_and_sort_by_bytes(store: &dyn Store) {
    let p = format!("{}/\\#?\u{1}\u{7f}\u{85} 😀", partition("chars"));
    let mut row_keys: Vec<String> = [
        "\u{0}",
        "\u{1f}",
        " ",
        "\"",
        "#",
        ".",
        "/",
        ">",
        "?",
        "[",
        "\\",
        "~",
        "\u{7f}",
        "\u{80}",
        "\u{9f}",
        "\u{a0}",
        "é",
        "\u{fffd}",
        "\u{ffff}",
        "😀",
        "\u{10ffff}",
    ]
    .iter()
    .flat_map(|character| [format!("k{character}"), format!("k{character}z")])
    .collect();
    row_keys.push("k".into());
    let writes = row_keys
        .iter()
        .map(|row| Write::put(Table::Events, Item::new(&p, row, row.clone())))
        .collect();
    store.batch_write(writes).await.unwrap();
    row_keys.sort();
    for row in &row_keys {
        assert_eq!(
            store.get(Table::Events, &p, row).await.unwrap(),
            Some(Bytes::from(row.clone())),
            "{row:?}"
        );
    }
    let all = store
        .query(Query::partition(Table::Events, &p, 100))
        .await
        .unwrap();
    assert_eq!(
        rows(&all),
        row_keys.iter().map(String::as_str).collect::<Vec<_>>()
    );
    for item in &all {
        assert_eq!(item.value, Bytes::from(item.row.clone()));
    }
    // A range bounded by keys of such characters holds exactly the keys between.
    let (start, end) = ("k/".to_owned(), "k\u{80}".to_owned());
    let between = store
        .query(
            Query::partition(Table::Events, &p, 100).range(Some(start.clone()), Some(end.clone())),
        )
        .await
        .unwrap();
    let expected: Vec<&str> = row_keys
        .iter()
        .filter(|row| **row >= start && **row < end)
        .map(String::as_str)
        .collect();
    assert_eq!(rows(&between), expected);
    let reversed = store
        .query(
            Query::partition(Table::Events, &p, 3)
                .reverse()
                .after(Some("k?".into())),
        )
        .await
        .unwrap();
    let below: Vec<&str> = row_keys
        .iter()
        .rev()
        .filter(|row| row.as_str() < "k?")
        .take(3)
        .map(String::as_str)
        .collect();
    assert_eq!(rows(&reversed), below);
}

/// Values larger than one property of some backends (Azure's 64 KiB) read back whole, by
/// key, by many keys and by query.
pub async fn values_over_64_kib_round_trip_by_every_read(store: &dyn Store) {
    let p = partition("big-values");
    let value = |seed: u8, size: usize| -> Bytes {
        (0..size)
            .map(|index| seed.wrapping_add((index % 253) as u8))
            .collect::<Vec<u8>>()
            .into()
    };
    let sizes = [64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1, 200_000];
    for (index, size) in sizes.iter().enumerate() {
        store
            .put(
                Table::Events,
                Item::new(&p, format!("r{index}"), value(index as u8, *size)),
                Condition::None,
            )
            .await
            .unwrap();
    }
    let keys = (0..sizes.len())
        .map(|index| Key::new(Table::Events, &p, format!("r{index}")))
        .collect();
    let many = store.get_many(keys).await.unwrap();
    let queried = store
        .query(Query::partition(Table::Events, &p, 10))
        .await
        .unwrap();
    assert_eq!(queried.len(), sizes.len());
    for (index, size) in sizes.iter().enumerate() {
        let expected = value(index as u8, *size);
        let row = format!("r{index}");
        assert_eq!(
            store.get(Table::Events, &p, &row).await.unwrap(),
            Some(expected.clone())
        );
        assert_eq!(many[index], Some(expected.clone()));
        assert_eq!(queried[index].value, expected);
    }
}

pub async fn ping_answers(store: &dyn Store) {
    store.ping().await.unwrap();
}

#[cfg(test)]
mod tests {
    /// A case missing from `store_conformance_tests!` would run on no backend.
    #[test]
    fn every_case_is_listed_in_the_macro() {
        let source = include_str!("conformance.rs");
        let (macro_text, cases_text) = source
            .split_once("\nfn assert_invalid_input")
            .expect("the helpers follow the macro");
        let cases: Vec<&str> = cases_text
            .lines()
            .filter_map(|line| line.strip_prefix("pub async fn "))
            .map(|rest| rest.split('(').next().unwrap_or(rest))
            .collect();
        assert!(cases.len() > 20, "{cases:?}");
        for case in cases {
            assert!(
                macro_text.contains(&format!("            {case},\n")),
                "{case} is not listed in store_conformance_tests!"
            );
        }
    }
}
