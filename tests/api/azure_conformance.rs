//! The store conformance suite on Azurite, one test per case, and the cases of Azure's own
//! limits: the atomic scope, escaped keys, values split across properties, continuation
//! pages. The cases share one set of tables, created once; each case connects a store of its
//! own and uses partition keys of its own.

use fanline::store::{AzureConfig, AzureStore, Store};
use tokio::sync::OnceCell;

use crate::azurite;

/// The table prefix of the suite's tables, once they exist.
static TABLE_PREFIX: OnceCell<String> = OnceCell::const_new();

fn connect(table_prefix: String) -> AzureStore {
    AzureStore::connect(&AzureConfig {
        connection_string: azurite::connection_string(),
        table_prefix,
    })
    .expect("connect")
}

/// A store on the suite's tables, creating them on first use.
async fn store() -> ((), AzureStore) {
    let table_prefix = TABLE_PREFIX
        .get_or_init(|| async {
            let table_prefix = format!("conf{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
            let store = connect(table_prefix.clone());
            store.create_tables().await.expect("create tables");
            table_prefix
        })
        .await;
    ((), connect(table_prefix.clone()))
}

fanline::store_conformance_tests!(store());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_tables_that_exist_already_succeeds() {
    let ((), store) = store().await;
    store.create_tables().await.expect("create tables again");
    store.ping().await.expect("ping");
}

/// What each call costs in requests, from the store's counters (docs/operations.md,
/// "Running on Azure"): one request a single-entity call, one more read for a value
/// compared, one per partition (up to 100 entities) of a batch, one per 1,000 rows a query
/// passes, a reverse read passing its whole range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_costs_the_requests_documented() {
    use fanline::store::{Condition, Item, Query, StoreExt, Table, Write};
    let ((), store) = store().await;
    let p = format!("costs-{}", uuid::Uuid::new_v4().simple());
    let counted = || store.stats().snapshot().requests;
    let mut before = counted();
    let mut cost = |what: &str, expected: u64| {
        let now = counted();
        assert_eq!(now - before, expected, "{what}");
        before = now;
    };

    store
        .put(Table::Markers, Item::new(&p, "m", "a"), Condition::None)
        .await
        .expect("put");
    cost("a put", 1);
    store
        .put(Table::Markers, Item::new(&p, "n", "a"), Condition::Absent)
        .await
        .expect("create");
    cost("a create if absent", 1);
    store
        .put(
            Table::Markers,
            Item::new(&p, "m", "b"),
            Condition::Equals("a".into()),
        )
        .await
        .expect("swap");
    cost("a compare-and-swap: a read and a write", 2);
    store
        .transact(vec![
            Write::put(Table::Markers, Item::new(&p, "o", "x")),
            Write::check(
                fanline::store::Key::new(Table::Markers, &p, "m"),
                Condition::Equals("b".into()),
            ),
        ])
        .await
        .expect("transaction");
    cost("a transaction comparing one value: a read and one group", 2);

    let deliveries: Vec<Write> = (0..250)
        .map(|index| {
            Write::put(
                Table::Timelines,
                Item::new(format!("{p}-{index}"), "e", "r"),
            )
        })
        .collect();
    store.batch_write(deliveries).await.expect("deliveries");
    cost("250 deliveries to 250 partitions", 250);
    let rows: Vec<Write> = (0..2_500)
        .map(|index| Write::put(Table::Timelines, Item::new(&p, format!("{index:05}"), "r")))
        .collect();
    store.batch_write(rows).await.expect("rows");
    cost("2,500 rows of one partition, 100 a group", 25);

    // Reads by key: a query per 14 keys of one partition (of one Azure table: a subject's
    // timeline and events share it).
    let keys: Vec<fanline::store::Key> = (0..28)
        .map(|index| fanline::store::Key::new(Table::Timelines, &p, format!("{index:05}")))
        .chain([fanline::store::Key::new(Table::Events, &p, "none")])
        .collect();
    let found = store.get_many(keys).await.expect("get many");
    assert!(found[..28].iter().all(Option::is_some) && found[28].is_none());
    cost("29 keys of one partition by key", 3);
    let spread: Vec<fanline::store::Key> = (0..50)
        .map(|index| fanline::store::Key::new(Table::Timelines, format!("{p}-{index}"), "e"))
        .collect();
    let found = store.get_many(spread).await.expect("get many");
    assert!(found.iter().all(Option::is_some));
    cost("50 keys of 50 partitions", 50);

    let page = store
        .query(Query::partition(Table::Timelines, &p, 250))
        .await
        .expect("page");
    assert_eq!(page.len(), 250);
    cost("a page of 250", 1);
    let all = store
        .query_all(Query::partition(Table::Timelines, &p, 2_500))
        .await
        .expect("all");
    assert_eq!(all.len(), 2_500);
    cost(
        "2,500 rows: 3 requests of up to 1,000, and 1 that finds no more",
        4,
    );
    let oldest = store
        .query(Query::partition(Table::Timelines, &p, 1).reverse())
        .await
        .expect("oldest");
    assert_eq!(oldest[0].row, "02499");
    cost("a reverse read of 1 passes the whole range", 3);
}
